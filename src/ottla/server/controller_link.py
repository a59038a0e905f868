"""A cluster broker's side of the controller protocol (Kafka's `ReplicaManager.becomeLeaderOrFollower`,
`stopReplicas` and `MetadataCache.updateMetadata`).

The LeaderAndIsr, UpdateMetadata and StopReplica handlers hand their requests here. One
controller epoch guards all three: a request from an older controller is refused with
STALE_CONTROLLER_EPOCH and changes nothing; one meant for an earlier incarnation of this
broker (an older broker epoch, KIP-380) gets STALE_BROKER_EPOCH. LeaderAndIsr creates the
local log of a partition this broker is now a replica of (with the topic's configs from
the store) before the replica manager takes the role; StopReplica with delete removes it.
A LeaderAndIsr naming a topic id other than that of the topic's local log is answered
INCONSISTENT_TOPIC_ID for those partitions and changes nothing: the log stays for an operator
to look at, as Kafka's ZooKeeper-mode broker does (`ReplicaManager.becomeLeaderOrFollower`).
A topic deleted and recreated while a replica's broker was down does not get there: the
deletion waits for that broker and its StopReplica (delete) removes the log first.
A broker holds only the partitions it is a replica of. One that was down while a partition
was moved off it missed that StopReplica (the controller sends nothing to a broker that is
not live): on its first UpdateMetadata it deletes every partition it holds that the
cluster's metadata gives to other brokers only (the stray replicas a KRaft broker deletes
on its first metadata image, KAFKA-14616).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from ..cluster.store import TopicPartition
from ..controller import wire
from ..controller.requests import LEADER_EPOCH_DURING_DELETE, PartitionState
from ..errors import ErrorCode, KafkaError
from .clock import now_ms
from .metadata_cache import BrokerInfo
from .metadata_cache import PartitionState as CachedState

__all__ = ["ControllerLink"]

log = logging.getLogger("ottla.cluster")


class ControllerLink:
    def __init__(self, broker, store):
        self.broker = broker
        self.store = store
        self.controller_epoch = -1
        self._lock = asyncio.Lock()  # one controller request at a time, in arrival order
        self.metadata_received = asyncio.Event()  # the first UpdateMetadata was applied

    def broker_epoch(self) -> int:
        registration = self.broker.membership.registration
        return -1 if registration is None else registration.epoch

    def _check(self, request) -> None:
        if request.controller_epoch < self.controller_epoch:
            self._refuse(request, ErrorCode.stale_controller_epoch,
                         f"controller epoch {request.controller_epoch} is older than {self.controller_epoch}")
        epoch = getattr(request, "broker_epoch", -1)
        if epoch != -1 and epoch < self.broker_epoch():
            self._refuse(request, ErrorCode.stale_broker_epoch,
                         f"broker epoch {epoch} is older than this broker's {self.broker_epoch()}")
        self.controller_epoch = request.controller_epoch

    @staticmethod
    def _refuse(request, code: ErrorCode, why: str):
        """Refusals are rare and change nothing: each one is worth a line."""
        log.warning("refused %s from controller %d (epoch %d): %s, %s", type(request).__name__.removesuffix("Request"),
                    request.controller_id, request.controller_epoch, code.name.upper(), why)
        raise KafkaError(code, why)

    # -- LeaderAndIsr -------------------------------------------------------------------------
    async def leader_and_isr(self, request) -> dict[TopicPartition, ErrorCode]:
        """Applied in several loop steps (`ReplicaManager.apply_in_slices`), and to the end even
        if the controller's connection drops meanwhile (its handler is then cancelled): a
        LeaderAndIsr half applied would leave roles no controller knows of."""
        return await asyncio.shield(self._leader_and_isr(request))

    async def _leader_and_isr(self, request) -> dict[TopicPartition, ErrorCode]:
        async with self._lock:
            self._check(request)
            states = wire.partition_states(request)
            ids = wire.topic_ids(request)
            mine = [s for s in states if self.broker.node_id in s.replicas]
            by_topic: dict[str, set[int]] = {}
            for s in mine:
                by_topic.setdefault(s.topic, set()).add(s.partition)
            inconsistent = {topic for topic in by_topic if self._other_local_id(topic, ids.get(topic))}
            for topic in sorted(by_topic.keys() - inconsistent):
                await self._ensure_logs(topic, ids.get(topic), by_topic[topic])
            fetchers = self.broker.replicas.fetchers
            if fetchers is not None:
                fetchers.learn_endpoints({int(b.broker_id): (b.host_name, int(b.port)) for b in request.live_leaders})

            def applied(part, errors) -> None:
                self.broker.metadata.update_from_leader_and_isr(
                    s for s in part if errors.get((s.topic, s.partition)) == ErrorCode.none)

            errors = await self.broker.replicas.apply_in_slices(
                [_cached(s) for s in mine if s.topic not in inconsistent], now_ms(), applied)
            errors.update({(s.topic, s.partition): ErrorCode.inconsistent_topic_id
                           for s in mine if s.topic in inconsistent})
            if log.isEnabledFor(logging.DEBUG):
                log.debug("LeaderAndIsr from controller %d (epoch %d) applied: %s", request.controller_id,
                          request.controller_epoch, _described(mine))
            return errors

    def _other_local_id(self, topic: str, topic_id: uuid.UUID | None) -> bool:
        """True when this broker holds partitions of `topic` under another topic id."""
        info = self.broker.logs.topics.get(topic)
        if info is None or topic_id is None or topic_id.int == 0 or info.topic_id == topic_id or not info.hosted:
            return False
        log.error("Topic ID in memory: %s does not match the topic ID for partitions %s of %s received: %s; "
                  "the local log is kept (INCONSISTENT_TOPIC_ID)", info.topic_id, sorted(info.hosted), topic, topic_id)
        return True

    async def _ensure_logs(self, topic: str, topic_id: uuid.UUID | None, partitions: set[int]) -> None:
        """The local catalog holds `partitions` of the topic under the cluster's topic id (a
        catalog entry of another id holding no partition here is replaced)."""
        logs = self.broker.logs
        info = logs.topics.get(topic)
        if info is not None and topic_id is not None and info.topic_id != topic_id:
            self._delete_local(topic)
            info = None
        count = max(partitions) + 1
        if info is None:
            dynamic = self.broker.dynamic_configs
            seen = dynamic.last_change_seen
            configs = await asyncio.to_thread(self.store.topic_configs, topic)
            info = logs.create_topic(topic, count, configs, topic_id=topic_id,
                                     absent=frozenset(range(count)) - partitions, validate_only=True)
            # The files in a worker thread (seconds for 1,000 partitions), the catalog on the loop.
            logs.add_created_topic(info, await asyncio.to_thread(logs.write_topic_files, info))
            if dynamic.last_change_seen != seen:  # a change announced meanwhile passed the absent log by
                await dynamic.reload_topics([topic])
            return
        if info.partitions < count:
            logs.add_partitions(topic, count, absent=frozenset(range(count)) - partitions)
        logs.host_partitions(topic, partitions)

    def _delete_local(self, topic: str) -> None:
        info = self.broker.logs.topics.get(topic)
        if info is None:
            return
        self.broker.replicas.remove_partitions([(topic, p) for p in info.hosted])
        self.broker.logs.delete_topic(topic)
        self.broker.groups.coordinator.on_topics_deleted([topic], now_ms())

    # -- UpdateMetadata -----------------------------------------------------------------------
    async def update_metadata(self, request) -> None:
        async with self._lock:
            self._check(request)
            brokers = [BrokerInfo(b.broker_id, b.host, b.port, b.rack) for b in wire.live_brokers(request)]
            try:
                deleted = self.broker.metadata.update(
                    controller_id=request.controller_id, controller_epoch=request.controller_epoch,
                    brokers=brokers, partition_states=[_cached(s) for s in wire.partition_states(request, "zk_version")],
                    topic_ids=wire.topic_ids(request))
            except KafkaError as exc:
                self._refuse(request, exc.code, str(exc))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("UpdateMetadata from controller %d (epoch %d) applied: %s", request.controller_id,
                          request.controller_epoch, _described(wire.partition_states(request, "zk_version")))
            if not self.metadata_received.is_set():
                self._delete_strays()
            self.metadata_received.set()
            if deleted:
                self.broker.groups.coordinator.on_topics_deleted(deleted, now_ms())

    def _delete_strays(self) -> None:
        """Delete the partitions held here that the metadata gives to other brokers only
        (moved away while this broker was down). Topics the metadata lacks, or has under
        another id, are left to topic deletion and to `_ensure_logs`."""
        metadata, node_id = self.broker.metadata, self.broker.node_id
        for info in list(self.broker.logs.topics.values()):
            cached = metadata.topic(info.name)
            if cached is None or cached.topic_id != info.topic_id:
                continue
            strays = {p for p in info.hosted if (state := cached.partitions.get(p)) is not None
                      and node_id not in state.replicas}
            if strays:
                log.info("deleting partitions %s of %s: other brokers hold them now (moved while broker %d "
                         "was away)", sorted(strays), info.name, node_id)
                self._delete_partitions(info.name, strays)

    def _delete_partitions(self, topic: str, partitions: set[int]) -> None:
        self.broker.replicas.remove_partitions([(topic, p) for p in partitions])
        self.broker.logs.delete_partitions(topic, partitions)

    # -- StopReplica --------------------------------------------------------------------------
    async def stop_replica(self, request) -> dict[TopicPartition, ErrorCode]:
        async with self._lock:
            self._check(request)
            results: dict[TopicPartition, ErrorCode] = {}
            deleted: list[TopicPartition] = []
            for topic in request.topic_states:
                for p in topic.partition_states:
                    key = (topic.topic_name, int(p.partition_index))
                    partition = self.broker.replicas.get_partition(*key)
                    epoch = int(p.leader_epoch)
                    if (partition is not None and epoch not in (-1, LEADER_EPOCH_DURING_DELETE)
                            and epoch < partition.leader_epoch):
                        results[key] = ErrorCode.fenced_leader_epoch
                        continue
                    self.broker.replicas.remove_partitions([key])
                    if p.delete_partition:
                        deleted.append(key)
                    results[key] = ErrorCode.none
            # A deleted topic goes whole (the coordinators forget it); a partition moved away
            # by a reassignment goes alone.
            for name in sorted({topic for topic, _ in deleted if not self.broker.metadata.has_topic(topic)}):
                self._delete_local(name)
            for name in sorted({topic for topic, _ in deleted if self.broker.metadata.has_topic(topic)}):
                self._delete_partitions(name, {p for topic, p in deleted if topic == name})
            return results


def _described(states: list[PartitionState], shown: int = 5) -> str:
    """For the debug lines the failover benchmark reads: a few partitions' leader and epoch."""
    listed = ", ".join(f"{s.topic}-{s.partition} leader {s.leader} epoch {s.leader_epoch}" for s in states[:shown])
    return f"{len(states)} partitions ({listed}{', ...' if len(states) > shown else ''})"


def _cached(state: PartitionState) -> CachedState:
    return CachedState(state.topic, state.partition, state.leader, state.leader_epoch, state.replicas,
                       state.isr, state.offline_replicas, state.controller_epoch, state.partition_epoch)
