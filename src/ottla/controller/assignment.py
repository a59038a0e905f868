"""Replica assignment for new topics and partitions: Kafka's `AdminUtils.assignReplicasToBrokers`.

The first replica of each partition goes round robin over the brokers from a random start;
the followers follow at a shift that grows by one after each full round, so the partitions
a broker leads have their followers spread over the other brokers. When every broker has a
rack, the brokers are first interleaved by rack and followers prefer racks (then brokers)
that hold no replica of the partition yet. Explicit assignments are checked with the rules
and error codes of Kafka 3.9's controller.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from ..cluster.store import BrokerRegistration
from ..errors import ErrorCode, KafkaError

__all__ = ["assign_replicas", "validate_assignment", "rack_alternated"]


def assign_replicas(brokers: Sequence[BrokerRegistration], partitions: int, replication_factor: int,
                    *, start_index: int = -1, start_partition: int = -1,
                    rng: random.Random | None = None) -> dict[int, tuple[int, ...]]:
    """Partition id -> replica ids. `start_index` -1 picks a random start (as Kafka does);
    CreatePartitions passes the existing topic's start and its partition count."""
    if partitions <= 0:
        raise KafkaError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise KafkaError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise KafkaError(ErrorCode.invalid_replication_factor,
                         f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.")
    ordered = sorted(brokers, key=lambda b: b.broker_id)
    racks = {b.broker_id: b.rack for b in ordered}
    if all(rack is None for rack in racks.values()):
        return _rack_unaware(partitions, replication_factor, [b.broker_id for b in ordered],
                             start_index, start_partition, rng or random.Random())
    if any(rack is None for rack in racks.values()):
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "Not all brokers have rack information for replica rack aware assignment.")
    return _rack_aware(partitions, replication_factor, racks, start_index, start_partition,
                       rng or random.Random())


def _replica_index(first: int, shift: int, replica: int, count: int) -> int:
    return (first + 1 + (shift + replica) % (count - 1)) % count


def _starts(count: int, start_index: int, rng: random.Random) -> tuple[int, int]:
    if start_index >= 0:
        return start_index, start_index
    return rng.randrange(count), rng.randrange(count)


def _rack_unaware(partitions: int, factor: int, ids: list[int], start_index: int,
                  start_partition: int, rng: random.Random) -> dict[int, tuple[int, ...]]:
    count = len(ids)
    start, shift = _starts(count, start_index, rng)
    result = {}
    partition = max(0, start_partition)
    for _ in range(partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        replicas = [ids[first]]
        replicas += [ids[_replica_index(first, shift, j, count)] for j in range(factor - 1)]
        result[partition] = tuple(replicas)
        partition += 1
    return result


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers interleaved by rack (racks sorted, brokers sorted within each): 0, 3, 6, 1, 4, ..."""
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in sorted(racks.items()):
        by_rack.setdefault(rack, []).append(broker_id)
    iterators = [iter(by_rack[rack]) for rack in sorted(by_rack)]
    result: list[int] = []
    index = 0
    while len(result) < len(racks):
        broker_id = next(iterators[index], None)
        if broker_id is not None:
            result.append(broker_id)
        index = (index + 1) % len(iterators)
    return result


def _rack_aware(partitions: int, factor: int, racks: Mapping[int, str], start_index: int,
                start_partition: int, rng: random.Random) -> dict[int, tuple[int, ...]]:
    arranged = rack_alternated(racks)
    count = len(arranged)
    rack_count = len(set(racks.values()))
    start, shift = _starts(count, start_index, rng)
    result = {}
    partition = max(0, start_partition)
    for _ in range(partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        leader = arranged[first]
        replicas = [leader]
        racks_used, brokers_used = {racks[leader]}, {leader}
        k = 0
        for _ in range(factor - 1):
            while True:
                broker_id = arranged[_replica_index(first, shift * rack_count, k, count)]
                rack = racks[broker_id]
                k += 1
                # Skip a broker whose rack already has a replica while some rack has none,
                # or that has a replica itself while some broker has none.
                if ((rack not in racks_used or len(racks_used) == rack_count)
                        and (broker_id not in brokers_used or len(brokers_used) == count)):
                    replicas.append(broker_id)
                    racks_used.add(rack)
                    brokers_used.add(broker_id)
                    break
        result[partition] = tuple(replicas)
        partition += 1
    return result


def validate_assignment(assignment: Mapping[int, Sequence[int]], registered: set[int], *,
                        first_partition: int = 0, replication_factor: int | None = None) -> None:
    """An explicit assignment (CreateTopics, CreatePartitions): partitions numbered on from
    `first_partition` without gaps, every replica a registered broker, no broker twice,
    one replication factor throughout. Raises KafkaError(INVALID_REPLICA_ASSIGNMENT)."""
    indexes = sorted(assignment)
    if indexes != list(range(first_partition, first_partition + len(indexes))):
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "partitions should be a consecutive 0-based integer sequence")
    for partition in indexes:
        replicas = list(assignment[partition])
        if not replicas:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             "The manual partition assignment includes an empty replica list.")
        for broker_id in sorted(replicas):
            if broker_id not in registered:
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"The manual partition assignment includes broker {broker_id}, "
                                 "but no such broker is registered.")
        if len(set(replicas)) != len(replicas):
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"The manual partition assignment includes a broker more than once: {replicas}.")
        if replication_factor is None:
            replication_factor = len(replicas)
        elif len(replicas) != replication_factor:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"The manual partition assignment includes a partition with {len(replicas)} "
                             "replica(s), but this is not consistent with previous partitions, which have "
                             f"{replication_factor} replica(s).")
