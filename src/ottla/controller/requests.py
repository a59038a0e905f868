"""What the controller wants sent, as plain data: (destination broker, kind, payload).

The controller never touches a socket; `RequestBatch` gathers, during one event, what each
broker must hear (Kafka's `ControllerBrokerRequestBatch`), and the asyncio edge turns each
`ControllerRequest` into LeaderAndIsr / UpdateMetadata / StopReplica of the generated classes.
Every payload carries the controller epoch, and the destination's broker epoch (KIP-380) so
a restarted broker ignores what was meant for its previous incarnation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from ..cluster.store import BrokerRegistration, LeaderAndIsr, TopicPartition

__all__ = ["PartitionState", "LeaderAndIsrPayload", "UpdateMetadataPayload", "StopReplicaPayload",
           "StopReplicaPartition", "ControllerRequest", "RequestBatch", "LEADER_DURING_DELETE",
           "LEADER_EPOCH_DURING_DELETE"]

# Kafka's LeaderAndIsr.LeaderDuringDelete: UpdateMetadata with it tells brokers to forget
# the partition; StopReplica's EpochDuringDelete lets the deletion pass any leader epoch.
LEADER_DURING_DELETE = -2
LEADER_EPOCH_DURING_DELETE = -2

RequestKind = Literal["LeaderAndIsr", "UpdateMetadata", "StopReplica"]


@dataclass(frozen=True)
class PartitionState:
    """One partition as LeaderAndIsr and UpdateMetadata describe it."""

    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int  # the state znode's version (Kafka's zkVersion)
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()
    is_new: bool = False


@dataclass(frozen=True)
class LeaderAndIsrPayload:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[PartitionState, ...]
    topic_ids: dict[str, uuid.UUID]
    live_leaders: tuple[BrokerRegistration, ...]


@dataclass(frozen=True)
class UpdateMetadataPayload:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[PartitionState, ...]
    live_brokers: tuple[BrokerRegistration, ...]
    topic_ids: dict[str, uuid.UUID]


@dataclass(frozen=True)
class StopReplicaPartition:
    topic: str
    partition: int
    leader_epoch: int
    delete: bool


@dataclass(frozen=True)
class StopReplicaPayload:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[StopReplicaPartition, ...]


@dataclass(frozen=True)
class ControllerRequest:
    destination: int
    kind: RequestKind
    payload: LeaderAndIsrPayload | UpdateMetadataPayload | StopReplicaPayload


def partition_state(tp: TopicPartition, state: LeaderAndIsr, replicas: tuple[int, ...], *,
                    adding: tuple[int, ...] = (), removing: tuple[int, ...] = (),
                    offline: tuple[int, ...] = (), is_new: bool = False) -> PartitionState:
    return PartitionState(tp[0], tp[1], state.controller_epoch, state.leader, state.leader_epoch,
                          tuple(state.isr), state.version, tuple(replicas), tuple(adding),
                          tuple(removing), tuple(offline), is_new)


@dataclass
class RequestBatch:
    """The requests of one controller event, merged per destination and kind."""

    leader_and_isr: dict[int, dict[TopicPartition, PartitionState]] = field(default_factory=dict)
    update_metadata: dict[int, dict[TopicPartition, PartitionState]] = field(default_factory=dict)
    # Brokers that must get an UpdateMetadata even with no partition (a broker joined or left).
    metadata_brokers: set[int] = field(default_factory=set)
    stop_replica: dict[int, dict[TopicPartition, StopReplicaPartition]] = field(default_factory=dict)

    def add_leader_and_isr(self, brokers, state: PartitionState) -> None:
        for broker_id in brokers:
            self.leader_and_isr.setdefault(broker_id, {})[(state.topic, state.partition)] = state

    def add_update_metadata(self, brokers, states=()) -> None:
        for broker_id in brokers:
            self.metadata_brokers.add(broker_id)
            target = self.update_metadata.setdefault(broker_id, {})
            for state in states:
                target[(state.topic, state.partition)] = state

    def add_stop_replica(self, brokers, tp: TopicPartition, leader_epoch: int, delete: bool) -> None:
        for broker_id in brokers:
            entries = self.stop_replica.setdefault(broker_id, {})
            previous = entries.get(tp)
            entries[tp] = StopReplicaPartition(tp[0], tp[1], leader_epoch,
                                               delete or (previous is not None and previous.delete))

    def build(self, controller_id: int, controller_epoch: int,
              brokers: dict[int, BrokerRegistration],
              topic_ids: dict[str, uuid.UUID]) -> list[ControllerRequest]:
        """The requests in Kafka's order: LeaderAndIsr, then UpdateMetadata, then StopReplica.
        Requests for brokers that are not live are dropped: they get the state when they return."""
        out: list[ControllerRequest] = []
        for broker_id, states in sorted(self.leader_and_isr.items()):
            if broker_id not in brokers or not states:
                continue
            leaders = {s.leader for s in states.values()}
            payload = LeaderAndIsrPayload(
                controller_id, controller_epoch, brokers[broker_id].epoch,
                tuple(states[tp] for tp in sorted(states)),
                {t: topic_ids[t] for t, _ in states if t in topic_ids},
                tuple(brokers[b] for b in sorted(leaders) if b in brokers))
            out.append(ControllerRequest(broker_id, "LeaderAndIsr", payload))
        live = tuple(brokers[b] for b in sorted(brokers))
        for broker_id in sorted(self.metadata_brokers):
            if broker_id not in brokers:
                continue
            states = self.update_metadata.get(broker_id, {})
            payload = UpdateMetadataPayload(
                controller_id, controller_epoch, brokers[broker_id].epoch,
                tuple(states[tp] for tp in sorted(states)), live,
                {t: topic_ids[t] for t, _ in states if t in topic_ids})
            out.append(ControllerRequest(broker_id, "UpdateMetadata", payload))
        for broker_id, entries in sorted(self.stop_replica.items()):
            if broker_id not in brokers or not entries:
                continue
            payload = StopReplicaPayload(controller_id, controller_epoch, brokers[broker_id].epoch,
                                         tuple(entries[tp] for tp in sorted(entries)))
            out.append(ControllerRequest(broker_id, "StopReplica", payload))
        return out
