"""Topic admin through the store, as any broker of a cluster does it (Kafka's `AdminZkClient`).

CreateTopics, CreatePartitions and DeleteTopics do not go through the controller: the
broker that receives them checks them against the store, computes the replica assignment
and writes `/brokers/topics/<t>` (or `/admin/delete_topics/<t>`); the controller's watch
does the rest. Errors are KafkaErrors with Kafka's codes and messages. Blocking (store
calls): handlers run these off the event loop.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Mapping, Sequence

from ..cluster.store import NoSuchTopic, TopicAssignment, TopicExists
from ..errors import ErrorCode, KafkaError
from .assignment import assign_replicas, validate_assignment

__all__ = ["plan_topic", "create_topic", "create_partitions", "delete_topic"]


def plan_topic(store, name: str, partitions: int, replication_factor: int,
               assignment: Mapping[int, Sequence[int]] | None = None,
               rng: random.Random | None = None) -> TopicAssignment:
    """The assignment a new topic would get; raises what CreateTopics must answer."""
    topics = store.topics()
    if name in topics or name in store.topics_to_delete():
        raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    live = store.live_brokers()
    if assignment:
        validate_assignment(assignment, set(live))
        replicas = {p: tuple(r) for p, r in assignment.items()}
    else:
        replicas = assign_replicas(list(live.values()), partitions, replication_factor, rng=rng)
    return TopicAssignment(name, uuid.uuid4(), replicas)


def create_topic(store, planned: TopicAssignment, configs: Mapping[str, str]) -> None:
    try:
        store.create_topic(planned, {k: str(v) for k, v in configs.items()})
    except TopicExists:
        raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{planned.name}' already exists.") from None


def create_partitions(store, name: str, count: int,
                      assignment: Sequence[Sequence[int]] | None = None, *,
                      validate_only: bool = False, rng: random.Random | None = None) -> TopicAssignment:
    """Grow `name` to `count` partitions; new assignments follow the existing ones."""
    current = store.topics().get(name)
    if current is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
    if name in store.topics_to_delete():
        raise KafkaError(ErrorCode.invalid_topic_exception, f"The topic {name} is queued for deletion.")
    existing = len(current.partitions)
    if count == existing:
        raise KafkaError(ErrorCode.invalid_partitions, f"Topic already has {existing} partitions.")
    if count < existing:
        raise KafkaError(ErrorCode.invalid_partitions,
                         f"Topic currently has {existing} partitions, which is higher than the requested {count}.")
    adding = count - existing
    first_replicas = current.partitions[min(current.partitions)]
    live = store.live_brokers()
    if assignment is not None:
        if len(assignment) != adding:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"Increasing the number of partitions by {adding} but {len(assignment)} "
                             "assignments provided.")
        new = {existing + i: tuple(r) for i, r in enumerate(assignment)}
        validate_assignment(new, set(live), first_partition=existing,
                            replication_factor=len(first_replicas))
    else:
        ordered = sorted(live)
        start = next((i for i, b in enumerate(ordered) if b >= first_replicas[0]), 0)
        new = assign_replicas(list(live.values()), adding, len(first_replicas),
                              start_index=start, start_partition=existing, rng=rng)
    updated = dataclasses.replace(current, partitions={**current.partitions, **new})
    if not validate_only:
        try:
            store.set_assignment(updated, None)
        except NoSuchTopic:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.") from None
    return updated


def delete_topic(store, name: str) -> None:
    try:
        store.request_topic_deletion(name)
    except NoSuchTopic:
        raise KafkaError(ErrorCode.unknown_topic_or_partition,
                         "This server does not host this topic-partition.") from None
