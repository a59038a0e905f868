"""The partitions this broker holds, their roles, and every wait on them (Kafka's `ReplicaManager`).

It owns one `Partition` per local log and applies the leadership the metadata says
(`apply_partition_states`, what LeaderAndIsr will call). Produce goes through
`append_records`, which answers once the acknowledgement `acks` asks for holds: acks=1 after
the leader's append, acks=-1 once the high watermark has passed the batch (one node: at
once, its ISR is itself; with replicas, once the ISR has it), NOT_ENOUGH_REPLICAS(_AFTER_APPEND)
when the ISR is below min.insync.replicas. Fetches wait here for data (`delayed_fetches`), and
anything may wait for a partition's high watermark to pass an offset (`after_high_watermark`),
which is how "durable" means "replicated to the ISR". Followers' fetches reach the leader's
state through `follower_fetched`; the replica fetchers (`fetchers`) and the ISR writer
(`isr_updates`) are plugged in by a cluster broker and absent on a single node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from ..errors import ErrorCode, KafkaError
from ..log.append_settings import ValidateElsewhere
from ..log.log import AppendResult
from ..log.manager import LogManager
from .delayed_fetch import DelayedFetches
from .metadata_cache import MetadataCache, PartitionState
from .partition import Partition
from .steps import producer_state_ready

__all__ = ["ReplicaManager", "ProduceResult", "LeadershipListener"]

log = logging.getLogger("ottla.replica")
# Partitions appended between two yields to the event loop (a few ms of work).
_APPENDS_PER_STEP = 256

TopicPartition = tuple[str, int]
# (topic, partition, is_leader, leader_epoch): the coordinators load or unload on it.
LeadershipListener = Callable[[str, int, bool, int], None]
OnHighWatermark = Callable[[ErrorCode], None]
# A LeaderAndIsr is applied this many partitions at a time, the event loop free in between: at
# 0.1-0.3 ms each on a loaded machine, 10-30 ms per step instead of 150-425 ms for 1,000.
APPLY_SLICE = 100
# Worker threads that fsync followers' epoch checkpoints ahead (concurrent fsyncs share journal commits).
CHECKPOINT_WRITERS = 4
# A produced batch whose records take more bytes than this (inflated) is validated in a worker
# thread: a bomb inflating to 32 x max.message.bytes held the loop 0.4-0.7 s of CPU. Above the
# default max.message.bytes, so uncompressed batches and librdkafka's stay on the loop.
INLINE_VALIDATION_BYTES = 1 << 20


class Fetchers(Protocol):
    """The follower side (`server/replica_fetcher.py`): which partitions to fetch, from whom."""

    def follow(self, partition: Partition) -> None: ...

    def unfollow(self, keys: Iterable[TopicPartition]) -> None: ...

    def learn_endpoints(self, endpoints: dict[int, tuple[str, int]]) -> None: ...


class IsrUpdates(Protocol):
    """Writes a leader's ISR proposals to the cluster store (`server/isr_updates.py`)."""

    def propose(self, partition: Partition, isr: frozenset[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """One partition's answer to a produce: the append's result or an error."""

    error: ErrorCode
    message: str | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    # KIP-467: (batch index, message) of each record at fault, for Produce v8+.
    record_errors: tuple[tuple[int, str], ...] = ()


class ReplicaManager:
    def __init__(self, node_id: int, logs: LogManager, metadata: MetadataCache | None = None):
        self.node_id = node_id
        self.logs = logs
        # What the cluster knows of each partition: a partition it has and this broker does not
        # host is NOT_LEADER_OR_FOLLOWER, not UNKNOWN_TOPIC_OR_PARTITION (`hosted_partition`).
        self.metadata = metadata
        self.lag_time_max_ms = logs.broker_config["replica.lag.time.max.ms"]
        self.fetchers: Fetchers | None = None
        self.isr_updates: IsrUpdates | None = None
        self.partitions: dict[TopicPartition, Partition] = {}
        self._listeners: list[LeadershipListener] = []
        self.delayed_fetches = DelayedFetches()
        # Per partition: (offset, callback) to run once the HW is past offset.
        self._hw_waiters: dict[TopicPartition, list[tuple[int, OnHighWatermark]]] = {}
        self._checkpoint_writers: ThreadPoolExecutor | None = None
        # One thread, so at most one large batch is inflated at a time: the memory bound stays
        # that of one (32 x max.message.bytes) plus the loop's INLINE_VALIDATION_BYTES.
        self._validation: ThreadPoolExecutor | None = None

    # -- partitions and roles ------------------------------------------------------------

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def hosted_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this broker hosts a replica of it. Else, as Kafka's
        getPartitionOrError: NOT_LEADER_OR_FOLLOWER when the metadata knows the partition (the
        client's metadata is stale, e.g. after a reassignment: it must refresh and go to the
        leader), UNKNOWN_TOPIC_OR_PARTITION when it does not."""
        found = self.partitions.get((topic, partition))
        if found is not None:
            return found
        if self.metadata is not None and self.metadata.partition(topic, partition) is not None:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.node_id} hosts no replica of {topic}-{partition}")
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown partition {topic}-{partition}")

    def leader_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this broker leads it; else UNKNOWN_TOPIC_OR_PARTITION or
        NOT_LEADER_OR_FOLLOWER (`hosted_partition`, then the partition's role)."""
        found = self.hosted_partition(topic, partition)
        found.check_leader()
        return found

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        """`listener(topic, partition, is_leader, leader_epoch)` when this broker becomes a
        partition's leader or stops leading it."""
        self._listeners.append(listener)

    def apply_partition_states(self, states: Iterable[PartitionState], now_ms: int = 0) -> dict[TopicPartition, ErrorCode]:
        """Take the roles `states` give this broker (LeaderAndIsr): leader where it is the
        leader, follower where it is another replica; per-partition errors, as Kafka answers.
        Followers are handed to the fetchers, new leaders taken from them."""
        errors: dict[TopicPartition, ErrorCode] = {}
        now_ms = now_ms or int(time.time() * 1000)
        followers: set[int] = set()  # of the partitions this broker starts leading (an epoch)
        for state in states:
            key = (state.topic, state.partition)
            if self.node_id not in state.replicas:
                continue
            partition = self.partitions.get(key)
            if partition is None:
                found = self.logs.logs.get(key)
                if found is None:
                    errors[key] = ErrorCode.kafka_storage_error
                    log.error("no log for %s-%d, which this broker is a replica of", *key)
                    continue
                partition = self.partitions[key] = Partition(state.topic, state.partition, found, self.node_id,
                                                             lag_time_max_ms=self.lag_time_max_ms)
            was_leader = partition.is_leader
            try:
                if state.leader == self.node_id:
                    changed = partition.make_leader(state.leader_epoch, state.isr, state.replicas, now_ms=now_ms,
                                                    zk_version=state.zk_version,
                                                    controller_epoch=state.controller_epoch)
                else:
                    changed = partition.make_follower(state.leader_epoch, state.leader, state.replicas, state.isr)
            except KafkaError as exc:
                errors[key] = exc.code
                continue
            errors[key] = ErrorCode.none
            if self.fetchers is not None:
                if partition.is_leader:
                    self.fetchers.unfollow([key])
                elif changed and partition.leader_id >= 0:
                    self.fetchers.follow(partition)
            if was_leader and not partition.is_leader:
                self._fail_waiters(key, ErrorCode.not_leader_or_follower)
            if changed:
                self.notify_data(*key)  # a delayed fetch answers the new role (Kafka's makeFollowers)
                if partition.is_leader:
                    followers.update(partition.replicas)
            if partition.is_leader != was_leader:
                # Only a new leader loads its coordinator state: a new epoch on the same leader
                # (a follower left the ISR, a reassignment) keeps it, as Kafka's makeLeaders.
                self._notify_leadership(partition)
        followers.discard(self.node_id)
        if followers:
            self.delayed_fetches.complete_followers(followers)
        return errors

    async def apply_in_slices(self, states: list[PartitionState], now_ms: int,
                              applied: Callable[[list[PartitionState], dict[TopicPartition, ErrorCode]], None],
                              ) -> dict[TopicPartition, ErrorCode]:
        """`apply_partition_states` for a big LeaderAndIsr without holding the event loop: the
        roles are taken `APPLY_SLICE` partitions at a time with the loop free in between (a new
        leader's epoch checkpoint is written later by the disk worker: `Log.start_leader_epoch`). Each partition changes role in one
        step, and `applied(slice, errors)` runs in that same step (the metadata cache), so a
        request sees a partition either wholly before or wholly after its change. The caller
        keeps other controller requests out until this returns (Kafka applies one
        LeaderAndIsr at a time, under each partition's lock)."""
        errors: dict[TopicPartition, ErrorCode] = {}
        for start in range(0, len(states), APPLY_SLICE):
            if start:
                await asyncio.sleep(0)
            part = states[start:start + APPLY_SLICE]
            done = self.apply_partition_states(part, now_ms)
            applied(part, done)
            errors.update(done)
        return errors

    async def write_epoch_checkpoints_ahead(self, writes: list[Callable[[], None] | None]) -> None:
        """Run `LeaderEpochCache.assign_ahead` writes in worker threads, `CHECKPOINT_WRITERS` at
        a time (concurrent fsyncs share the file system's journal commits): a restarted
        follower's first batches of its leaders' new epochs (`replica_fetcher.py`). Best effort:
        the `assign` on the loop writes whatever is still due, and fails as before if the disk
        does. (A new leader's own entry is not written ahead but later: `Log.start_leader_epoch`.)"""
        writes = [w for w in writes if w is not None]
        if not writes:
            return
        if self._checkpoint_writers is None:
            self._checkpoint_writers = ThreadPoolExecutor(CHECKPOINT_WRITERS, thread_name_prefix="ottla-epoch-checkpoint")
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._checkpoint_writers, write) for write in writes),
                             return_exceptions=True)

    def remove_partitions(self, keys: Iterable[TopicPartition]) -> None:
        """The partitions are gone (topic deleted, StopReplica with delete): drop them and answer
        whatever waits on them. The logs themselves belong to the LogManager."""
        for key in keys:
            partition = self.partitions.pop(key, None)
            if partition is None:
                continue
            was_leader = partition.is_leader
            partition.make_offline()
            if self.fetchers is not None:
                self.fetchers.unfollow([key])
            self._fail_waiters(key, ErrorCode.not_leader_or_follower)
            self.notify_data(*key)
            if was_leader:
                self._notify_leadership(partition)

    def _notify_leadership(self, partition: Partition) -> None:
        for listener in self._listeners:
            try:
                listener(partition.topic, partition.index, partition.is_leader, partition.leader_epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", partition.topic, partition.index)

    # -- appends -------------------------------------------------------------------------

    def append(self, topic: str, partition: int, records, *, now_ms: int, origin: str = "client") -> AppendResult:
        """Append on the leader and wake whatever the append satisfies. Raises KafkaError."""
        return self._append_on(self.leader_partition(topic, partition), (topic, partition), records, now_ms, origin)

    def _append_on(self, target: Partition, key: TopicPartition, records, now_ms: int, origin: str) -> AppendResult:
        """`append` on a partition this broker leads (`leader_partition`, in the same step)."""
        hw_before = target.log.high_watermark
        result = target.append_as_leader(records, now_ms=now_ms, origin=origin)
        if not result.duplicate:
            self.delayed_fetches.notify(key)
        high_watermark = target.log.high_watermark
        if high_watermark != hw_before:
            self._complete_hw_waiters(key, high_watermark)
        return result

    async def append_records(self, entries: dict[TopicPartition, bytes], *, acks: int, timeout_ms: int,
                             now_ms: int, origin: str = "client",
                             precheck: Callable[[str, int, bytes], tuple[ErrorCode, str | None] | None] | None = None,
                             ) -> dict[TopicPartition, ProduceResult]:
        """Append each partition's records; return when `acks` holds for all of them.

        acks 0 and 1: after the leader's append. acks -1: once each partition's high watermark
        is past its batch, or REQUEST_TIMED_OUT after `timeout_ms` (the records stay in the
        log, as in Kafka). `precheck` may refuse a partition before anything is appended.
        """
        results: dict[TopicPartition, ProduceResult] = {}
        waits: dict[TopicPartition, asyncio.Future] = {}
        for done, (key, records) in enumerate(entries.items(), 1):
            if done % _APPENDS_PER_STEP == 0:  # a Produce naming 200,000 partitions held the loop for 1 s
                await asyncio.sleep(0)
            topic, index = key
            checked = records
            while True:
                try:
                    target = self.leader_partition(topic, index)
                    if not target.log.producer_state_ready:  # the first append since a start
                        await producer_state_ready(target.log)
                        target = self.leader_partition(topic, index)  # leadership may have moved meanwhile
                    target.check_enough_replicas(acks)
                    refused = precheck(topic, index, records) if precheck is not None else None
                    if refused is not None:
                        results[key] = ProduceResult(*refused)
                        break
                    if origin == "client":
                        checked = target.log.validate(checked, now_ms, INLINE_VALIDATION_BYTES)
                    # the partition looked up above: nothing between here and there yields
                    result = self._append_on(target, key, checked, now_ms, origin)
                except ValidateElsewhere as heavy:
                    # Checked in a thread, then everything above again in one step with the batch
                    # as checked: the append (producer state, sequence) happens as if inline.
                    checked = await self.off_loop(heavy.validate)
                    continue
                except KafkaError as exc:
                    results[key] = ProduceResult(exc.code, exc.message,
                                                 record_errors=tuple(getattr(exc, "record_errors", ())))
                    break
                results[key] = ProduceResult(ErrorCode.none, None, result.base_offset,
                                             result.log_append_time, result.log_start_offset)
                if acks == -1:
                    offset = result.last_offset + 1
                    # A leader that is its whole ISR has moved the HW past the batch in the append:
                    # answered now, as the waiter would be in this same step, without a future.
                    error = target.acks_all_result(offset) if target.log.high_watermark >= offset else None
                    if error is None:
                        waits[key] = self._acks_all_future(topic, index, offset)
                    elif error != ErrorCode.none:
                        results[key] = ProduceResult(error)
                break
        if waits:
            pending = [f for f in waits.values() if not f.done()]
            if len(pending) == 1:  # the usual produce (librdkafka's: one partition): awaited itself,
                try:  # it resumes this task in the turn after the HW move; asyncio.wait takes two
                    async with asyncio.timeout(timeout_ms / 1000):
                        await pending[0]  # cancelled by the timeout, as below
                except TimeoutError:
                    pass
            elif pending:
                await asyncio.wait(pending, timeout=timeout_ms / 1000)
            for key, future in waits.items():
                if not future.done() or future.cancelled():
                    future.cancel()
                    error = ErrorCode.request_timed_out
                else:
                    error = future.result()
                if error != ErrorCode.none:
                    results[key] = ProduceResult(error)
        return results

    async def off_loop(self, work: Callable, *args):
        """`work(*args)` in the validation thread: checking or converting a large produced batch,
        one at a time (`_validation`)."""
        if self._validation is None:
            self._validation = ThreadPoolExecutor(1, thread_name_prefix="ottla-validate")
        return await asyncio.get_running_loop().run_in_executor(self._validation, work, *args)

    # -- the high watermark --------------------------------------------------------------

    def after_high_watermark(self, topic: str, partition: int, offset: int, callback: OnHighWatermark) -> None:
        """Run `callback(ErrorCode.none)` once the HW is at or past `offset` (at once if it is),
        or `callback(NOT_LEADER_OR_FOLLOWER)` if this broker stops leading the partition first."""
        target = self.partitions.get((topic, partition))
        if target is None or not target.is_leader:
            callback(ErrorCode.not_leader_or_follower)
        elif target.high_watermark >= offset:
            callback(ErrorCode.none)
        else:
            self._hw_waiters.setdefault((topic, partition), []).append((offset, callback))

    def _acks_all_future(self, topic: str, partition: int, offset: int) -> asyncio.Future:
        """Resolves once the HW passed `offset`: NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when
        the ISR fell below min.insync.replicas meanwhile (Kafka's checkEnoughReplicasReachOffset)."""
        future = asyncio.get_running_loop().create_future()

        def done(error: ErrorCode) -> None:
            if error == ErrorCode.none:
                target = self.partitions.get((topic, partition))
                error = target.acks_all_result(offset) if target is not None else ErrorCode.not_leader_or_follower
            if not future.done():
                future.set_result(error)

        self.after_high_watermark(topic, partition, offset, done)
        return future

    def follower_fetched(self, topic: str, partition: int, replica_id: int, fetch_offset: int, now_ms: int) -> Partition:
        """A follower's Fetch from `fetch_offset` reached the leader: its progress moves the HW
        (waking acks=all and delayed fetches) and may bring it back into the ISR. Raises
        NOT_LEADER_OR_FOLLOWER when this broker does not lead or `replica_id` is no replica."""
        target = self.leader_partition(topic, partition)
        if target.update_follower_fetch(replica_id, fetch_offset, now_ms):
            self.high_watermark_moved(topic, partition)
        if self.isr_updates is not None and replica_id not in target.isr:  # Kafka's maybeExpandIsr: this follower
            expanded = target.propose_isr_expand()
            if expanded is not None:
                log.info("Expanding ISR of %s-%d from %s to %s (follower %d fetching at %d, HW %d)", topic, partition,
                         sorted(target.isr), sorted(expanded), replica_id, fetch_offset, target.high_watermark)
                self.isr_updates.propose(target, expanded)
        return target

    def propose_isr_shrinks(self, now_ms: int) -> None:
        """The periodic ISR check (Kafka's isr-expiration, every replica.lag.time.max.ms / 2):
        each led partition with followers behind for longer than the lag time proposes a
        smaller ISR."""
        if self.isr_updates is None:
            return
        for partition in list(self.partitions.values()):
            if partition.is_leader:
                shrunk = partition.propose_isr_shrink(now_ms)
                if shrunk is not None:
                    log.info("Shrinking ISR of %s-%d from %s to %s (HW %d, log end %d)", partition.topic,
                             partition.index, sorted(partition.isr), sorted(shrunk), partition.high_watermark,
                             partition.log_end_offset)
                    self.isr_updates.propose(partition, shrunk)

    def high_watermark_moved(self, topic: str, partition: int) -> None:
        """Someone (a follower's fetch, the replication layer) moved the HW: wake the waiters."""
        target = self.partitions.get((topic, partition))
        if target is not None:
            self._complete_hw_waiters((topic, partition), target.high_watermark)
            self.notify_data(topic, partition)

    def _complete_hw_waiters(self, key: TopicPartition, high_watermark: int) -> None:
        waiters = self._hw_waiters.get(key)
        if not waiters:
            return
        ready = [w for w in waiters if w[0] <= high_watermark]
        if not ready:
            return
        remaining = [w for w in waiters if w[0] > high_watermark]
        if remaining:
            self._hw_waiters[key] = remaining
        else:
            del self._hw_waiters[key]
        for _, callback in ready:
            callback(ErrorCode.none)

    def _fail_waiters(self, key: TopicPartition, error: ErrorCode) -> None:
        for _, callback in self._hw_waiters.pop(key, ()):
            callback(error)

    # -- delayed fetch -------------------------------------------------------------------

    def notify_data(self, topic: str, partition: int) -> None:
        """Wake the fetches waiting on this partition (an append, a HW move, a role change)."""
        self.delayed_fetches.notify((topic, partition))

    def close(self) -> None:
        """Answer every waiter: the broker is going away."""
        for key in list(self._hw_waiters):
            self._fail_waiters(key, ErrorCode.not_leader_or_follower)
        for pool in (self._checkpoint_writers, self._validation):
            if pool is not None:
                pool.shutdown(wait=True)
