"""The controller's picture of the cluster (Kafka's `ControllerContext`) and its settings.

Everything here is a cache of the store, filled when this broker becomes controller and
kept current by the controller's own (fenced) writes and by the watches. The state
machines read and change it, and add what brokers must hear to the event's `RequestBatch`.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

from ..cluster.store import (
    NO_LEADER,
    BrokerRegistration,
    ControllerEpoch,
    LeaderAndIsr,
    TopicAssignment,
    TopicPartition,
)
from .requests import LEADER_DURING_DELETE, ControllerRequest, PartitionState, RequestBatch, partition_state

__all__ = ["PartitionPhase", "ReplicaPhase", "ControllerConfig", "ControllerContext", "Replica"]

Replica = tuple[TopicPartition, int]  # (partition, broker id): Kafka's PartitionAndReplica


class PartitionPhase(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


class ReplicaPhase(enum.Enum):
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"
    NON_EXISTENT = "NonExistentReplica"


@dataclass(frozen=True)
class ControllerConfig:
    """The broker settings the controller acts on (Kafka's names and defaults)."""

    unclean_leader_election_enable: bool = False          # unclean.leader.election.enable
    auto_leader_rebalance_enable: bool = True             # auto.leader.rebalance.enable
    leader_imbalance_check_interval_ms: int = 300_000     # leader.imbalance.check.interval.seconds
    leader_imbalance_per_broker_percentage: int = 10      # leader.imbalance.per.broker.percentage

    @classmethod
    def from_broker_config(cls, config) -> "ControllerConfig":
        return cls(config["unclean.leader.election.enable"], config["auto.leader.rebalance.enable"],
                   config["leader.imbalance.check.interval.seconds"] * 1000,
                   config["leader.imbalance.per.broker.percentage"])


class ControllerContext:
    def __init__(self, broker_id: int, epoch: ControllerEpoch,
                 sink: Callable[[list[ControllerRequest]], None] | None = None):
        self.broker_id = broker_id
        self.epoch = epoch
        self.sink = sink  # takes each batch as it closes; without one, `take_requests` returns them
        self.brokers: dict[int, BrokerRegistration] = {}   # live, shutting down included
        self.shutting_down: set[int] = set()
        self.topics: dict[str, TopicAssignment] = {}
        self.leadership: dict[TopicPartition, LeaderAndIsr] = {}
        self.partition_phase: dict[TopicPartition, PartitionPhase] = {}
        self.replica_phase: dict[Replica, ReplicaPhase] = {}
        self.deleting: set[str] = set()
        self.batch = RequestBatch()
        self.sent: list[ControllerRequest] = []

    # -- brokers ---------------------------------------------------------------------------
    def live_ids(self) -> set[int]:
        """Live brokers that are not shutting down: the only ones that may lead."""
        return set(self.brokers) - self.shutting_down

    def is_online(self, broker_id: int, include_shutting_down: bool = False) -> bool:
        if include_shutting_down:
            return broker_id in self.brokers
        return broker_id in self.brokers and broker_id not in self.shutting_down

    # -- partitions ------------------------------------------------------------------------
    def partitions(self, topics=None) -> Iterator[TopicPartition]:
        for name in sorted(self.topics if topics is None else topics):
            assignment = self.topics.get(name)
            if assignment is not None:
                for p in sorted(assignment.partitions):
                    yield (name, p)

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.topics.get(tp[0])
        if assignment is None:
            return ()
        return tuple(assignment.partitions.get(tp[1], ()))

    def adding(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.topics.get(tp[0])
        return tuple(assignment.adding_replicas.get(tp[1], ())) if assignment else ()

    def removing(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.topics.get(tp[0])
        return tuple(assignment.removing_replicas.get(tp[1], ())) if assignment else ()

    def replicas_on(self, broker_ids: set[int]) -> list[Replica]:
        return [(tp, b) for tp in self.partitions() for b in self.replicas(tp) if b in broker_ids]

    def topic_ids(self) -> dict[str, uuid.UUID]:
        return {name: a.topic_id for name, a in self.topics.items()}

    def leader(self, tp: TopicPartition) -> int:
        state = self.leadership.get(tp)
        return NO_LEADER if state is None else state.leader

    # -- what brokers must hear ------------------------------------------------------------
    def partition_state(self, tp: TopicPartition, is_new: bool = False) -> PartitionState:
        state = self.leadership[tp]
        if tp[0] in self.deleting:
            state = LeaderAndIsr(LEADER_DURING_DELETE, state.leader_epoch, state.isr,
                                 state.controller_epoch, state.version)
        replicas = self.replicas(tp)
        offline = tuple(r for r in replicas if r not in self.brokers)
        return partition_state(tp, state, replicas, adding=self.adding(tp), removing=self.removing(tp),
                               offline=offline, is_new=is_new)

    def send_leader_and_isr(self, brokers, tp: TopicPartition, is_new: bool = False) -> None:
        """LeaderAndIsr for `tp` to `brokers`, and the same state to every broker's metadata."""
        if tp not in self.leadership:
            return
        state = self.partition_state(tp, is_new)
        self.batch.add_leader_and_isr(brokers, state)
        self.batch.add_update_metadata(self.brokers, [state])

    def send_update_metadata(self, brokers, tps=()) -> None:
        states = [self.partition_state(tp) for tp in tps if tp in self.leadership]
        self.batch.add_update_metadata(brokers, states)

    def flush(self) -> None:
        """Close the current batch (Kafka sends one per state-machine step): requests to
        brokers not live at this moment are dropped, so a bounced broker never gets what
        was meant for its previous incarnation. With a sink the batch goes out now, while
        the event goes on (a failover's elections no longer wait for the ISR writes after
        them, nor a new controller's first UpdateMetadata for its elections)."""
        batch, self.batch = self.batch, RequestBatch()
        built = batch.build(self.broker_id, self.epoch.epoch, self.brokers, self.topic_ids())
        if self.sink is not None and built:
            self.sink(built)
        else:
            self.sent += built

    def take_requests(self) -> list[ControllerRequest]:
        self.flush()
        sent, self.sent = self.sent, []
        return sent
