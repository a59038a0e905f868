"""The broker's view of the cluster: brokers, controller, topics and partition leadership.

Kafka's `MetadataCache`: every handler that answers about the cluster (Metadata,
DescribeCluster, FindCoordinator, the topic admin APIs, the leadership checks of Produce,
Fetch and ListOffsets) reads this instead of the storage catalog, so that what a broker
*stores* and what the cluster *is* can differ. A single node fills it from its own catalog
(`local_update`); in a cluster the controller's UpdateMetadata fills it through `update`,
with Kafka's semantics: a request from an older controller epoch is refused, a full update
replaces every topic, an incremental one replaces the partitions it names, and a partition
whose leader is `LEADER_DURING_DELETE` is removed.

Plain data, no I/O, no asyncio: the controller and unit tests drive it directly.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Iterable

from ..errors import ErrorCode, KafkaError

__all__ = ["BrokerInfo", "PartitionState", "TopicMetadata", "MetadataCache", "NO_LEADER", "LEADER_DURING_DELETE"]

NO_LEADER = -1
# Kafka's LeaderAndIsr.LeaderDuringDelete: an UpdateMetadata partition state that deletes it.
LEADER_DURING_DELETE = -2


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as UpdateMetadata describes it (`UpdateMetadataPartitionState`)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    controller_epoch: int = 0
    zk_version: int = -1  # the state znode's version (LeaderAndIsr's partition_epoch)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


class MetadataCache:
    """What this broker believes about the cluster; replaced wholesale or per partition."""

    def __init__(self, node_id: int, cluster_id: str):
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.controller_id = NO_LEADER
        # -1: nothing from a controller yet, so the first controller's epoch is accepted.
        self.controller_epoch = -1
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicMetadata] = {}
        self._by_id: dict[uuid.UUID, str] = {}
        self._derived: dict = {}

    # -- reads ---------------------------------------------------------------------------

    @property
    def brokers(self) -> list[BrokerInfo]:
        """Alive brokers, by id."""
        return [self._brokers[i] for i in sorted(self._brokers)]

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._brokers.get(node_id)

    @property
    def this_broker(self) -> BrokerInfo | None:
        return self._brokers.get(self.node_id)

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> TopicMetadata | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        name = self._by_id.get(topic_id)
        return self._topics.get(name) if name is not None else None

    def has_topic(self, name: str) -> bool:
        return name in self._topics

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        info = self._topics.get(topic)
        return info.partitions.get(partition) if info is not None else None

    def leader(self, topic: str, partition: int) -> BrokerInfo | None:
        """The partition's leader if it is alive and known, else None (offline or unknown)."""
        state = self.partition(topic, partition)
        return self._brokers.get(state.leader) if state is not None else None

    def alive_leader(self, state: PartitionState) -> int:
        """The leader id clients may be sent to: NO_LEADER when the state names a broker that
        is not alive (a partition whose replicas are all down keeps its last leader in the
        controller's state; Kafka answers it LEADER_NOT_AVAILABLE with no leader)."""
        return state.leader if state.leader in self._brokers else NO_LEADER

    def derived(self, key, build):
        """`build()`, kept until the next change of this cache: what handlers derive from it
        (Metadata's encoded topics) is built once per change, not once per request."""
        value = self._derived.get(key)
        if value is None:
            value = self._derived[key] = build()
        return value

    def check_leader(self, topic: str, partition: int) -> PartitionState:
        """The partition's state if this broker leads it; raises UNKNOWN_TOPIC_OR_PARTITION or
        NOT_LEADER_OR_FOLLOWER (Kafka's answers to a client that went to the wrong broker)."""
        state = self.partition(topic, partition)
        if state is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition)
        if state.leader != self.node_id:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.node_id} is not the leader of {topic}-{partition}")
        return state

    # -- writes --------------------------------------------------------------------------

    def update(
        self,
        *,
        controller_id: int,
        controller_epoch: int,
        brokers: Iterable[BrokerInfo],
        partition_states: Iterable[PartitionState],
        topic_ids: dict[str, uuid.UUID],
        full: bool = False,
    ) -> list[str]:
        """Apply an UpdateMetadata; returns the names of topics that were deleted.

        Refuses (STALE_CONTROLLER_EPOCH, changing nothing) a controller epoch older than the
        newest seen. Brokers are always the full list of alive brokers, as in Kafka. With
        `full`, topics not named are dropped; otherwise only the named partitions change.
        """
        if controller_epoch < self.controller_epoch:
            raise KafkaError(ErrorCode.stale_controller_epoch,
                             f"controller epoch {controller_epoch} is older than {self.controller_epoch}")
        states = list(partition_states)
        for state in states:
            if state.leader != LEADER_DURING_DELETE and state.topic not in topic_ids and state.topic not in self._topics:
                raise KafkaError(ErrorCode.invalid_request, f"no topic id for {state.topic}")
        self._derived = {}
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self._brokers = {b.node_id: b for b in brokers}
        before = set(self._topics)
        topics = {} if full else {name: TopicMetadata(t.name, t.topic_id, dict(t.partitions))
                                  for name, t in self._topics.items()}
        for state in states:
            current = topics.get(state.topic)
            if state.leader == LEADER_DURING_DELETE:
                if current is not None:
                    current.partitions.pop(state.partition, None)
                    if not current.partitions:
                        del topics[state.topic]
                continue
            topic_id = topic_ids.get(state.topic) or (current.topic_id if current else None)
            if current is None or current.topic_id != topic_id:
                # A new topic, or one deleted and re-created under the same name.
                current = topics[state.topic] = TopicMetadata(state.topic, topic_id)
            current.partitions[state.partition] = state
        self._topics = topics
        self._by_id = {t.topic_id: t.name for t in topics.values()}
        return sorted(before - set(topics))

    def update_from_leader_and_isr(self, states: Iterable[PartitionState]) -> None:
        """The leader, epoch and ISR of partitions whose roles this broker just took from a
        LeaderAndIsr. The controller's UpdateMetadata follows it, but a broker that has
        stopped leading answers NOT_LEADER_OR_FOLLOWER at once: until then its Metadata named
        itself leader, and clients that asked it went on sending there (a KRaft broker applies
        both from one metadata record). Only topics this cache knows, and no older epoch."""
        changed: dict[str, dict[int, PartitionState]] = {}
        for state in states:
            info = self._topics.get(state.topic)
            current = info.partitions.get(state.partition) if info is not None else None
            if info is None or (current is not None and current.leader_epoch > state.leader_epoch):
                continue
            if current is not None:
                state = replace(state, offline_replicas=current.offline_replicas)
            changed.setdefault(state.topic, {})[state.partition] = state
        if changed:  # one copy per request, not per partition (1,000 partitions cost 1,000 copies)
            self._derived = {}
            self._topics = {**self._topics, **{
                name: TopicMetadata(self._topics[name].name, self._topics[name].topic_id,
                                    {**self._topics[name].partitions, **parts})
                for name, parts in changed.items()}}

    def local_put(self, name: str, topic_id: uuid.UUID, count: int) -> list[PartitionState]:
        """Single node: one topic created or grown, in place (its partitions only: rebuilding
        every topic per creation made creating the 2,000th topic cost 100 ms of the loop)."""
        states = {p: PartitionState(name, p, self.node_id, 0, (self.node_id,), (self.node_id,)) for p in range(count)}
        self._derived = {}
        self._topics[name] = TopicMetadata(name, topic_id, states)
        self._by_id[topic_id] = name
        return list(states.values())

    def local_remove(self, name: str) -> None:
        """Single node: one topic deleted, in place."""
        self._derived = {}
        info = self._topics.pop(name, None)
        if info is not None:
            self._by_id.pop(info.topic_id, None)

    def local_update(self, this_broker: BrokerInfo, topics: Iterable[tuple[str, uuid.UUID, int]]) -> list[str]:
        """Single node: this broker is the only broker, the controller and the only replica of
        every partition of `topics` (name, topic id, partition count), at leader epoch 0."""
        topics = list(topics)
        states = [PartitionState(name, p, self.node_id, 0, (self.node_id,), (self.node_id,))
                  for name, _, count in topics for p in range(count)]
        return self.update(controller_id=self.node_id, controller_epoch=max(self.controller_epoch, 0),
                           brokers=[this_broker], partition_states=states,
                           topic_ids={name: topic_id for name, topic_id, _ in topics}, full=True)
