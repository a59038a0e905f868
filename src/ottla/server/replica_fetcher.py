"""Followers copying their leaders' logs (Kafka's ReplicaFetcherManager / ReplicaFetcherThread).

One fetcher task per source broker, on the event loop, over the inter-broker client. Each
partition it follows has a `replication.follower.FollowerFetchState` that says what to ask
next: OffsetsForLeaderEpoch first (truncate to where this log and the leader's agree,
KIP-101/279), then Fetch with this broker's replica id, the current leader epoch and the
last fetched epoch (KIP-320/595), appending what comes back and taking the leader's HW;
ListOffsets after OFFSET_OUT_OF_RANGE. Requests use Kafka's settings `replica.fetch.min.bytes`,
`replica.fetch.wait.max.ms`, `replica.fetch.max.bytes`, `replica.fetch.response.max.bytes`
and back off `replica.fetch.backoff.ms` after errors. Each fetcher keeps an incremental fetch
session with its leader (KIP-227, Kafka's FetchSessionHandler): once the session exists a Fetch
names only the partitions whose fetch position or epochs moved, and forgets those no longer
fetched; a session error or a failed request makes the next Fetch a full one. A LeaderAndIsr that makes this broker
follower of a partition (`follow`) moves it to its leader's fetcher; leadership and
StopReplica take it away (`unfollow`). Appends yield to the loop between partitions.
Once the broker is shutting down (`shutting_down`, before its ControlledShutdown), a partition
it is told to follow is not fetched: the leader it handed the partition to would take it back
into the ISR as soon as it fetched (it has the whole log), and acks=all would then wait for a
broker that is about to go, until the controller sees it gone (a KRaft leader refuses a
shutting-down broker into the ISR, KIP-841). The partitions it already follows go on being
fetched until the controller takes it out of their ISRs.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from datetime import timedelta
from functools import partial
from typing import Iterable

from kio.schema.fetch.v12 import request as fetch_request
from kio.schema.list_offsets.v7 import request as list_offsets_request
from kio.schema.offset_for_leader_epoch.v4 import request as epoch_request

from ..errors import ErrorCode, KafkaError
from ..failpoints import crash_at
from ..fetch_sessions import FetchSessionHandler
from ..failpoints import from_environment as failpoints_from_environment
from ..records.batch import HEADER_SIZE, LOG_OVERHEAD, PARTITION_LEADER_EPOCH_OFFSET
from ..replication.follower import FetchPhase, FollowerFetchState
from .clock import now_ms
from .interbroker import BrokerNotAvailable, InterBrokerClient, RequestTimedOut
from .partition import Partition
from .steps import producer_state_ready

__all__ = ["ReplicaFetcherManager"]

log = logging.getLogger("ottla.replica")

TopicPartition = tuple[str, int]
EARLIEST, LATEST = -2, -1
_BASE_AND_LENGTH = struct.Struct(">qi")
_EPOCH = struct.Struct(">i")
# Failpoint (ottla.failpoints): kill -9 between a follower's append and its HW update.
AFTER_FOLLOWER_APPEND = "replica.after_follower_append"
# Failpoint: a follower appends what its leader sends but keeps its HW (as if every answer's HW
# were still in flight), so a test can elect it with its HW below the start of its epoch.
HOLD_HIGH_WATERMARK = "replica.hold_high_watermark"


class ReplicaFetcherManager:
    def __init__(self, broker, client: InterBrokerClient):
        self.broker = broker
        self.client = client
        config = broker.config
        self.settings = dict(min_bytes=config["replica.fetch.min.bytes"], max_wait_ms=config["replica.fetch.wait.max.ms"],
                             partition_max_bytes=config["replica.fetch.max.bytes"],
                             max_bytes=config["replica.fetch.response.max.bytes"],
                             backoff_ms=config["replica.fetch.backoff.ms"],
                             timeout_ms=config["replica.socket.timeout.ms"] + config["replica.fetch.wait.max.ms"])
        self._fetchers: dict[int, _Fetcher] = {}
        self._shutting_down = False
        self._endpoints: dict[int, tuple[str, int]] = {}
        self._source_of: dict[TopicPartition, int] = {}
        failpoints = failpoints_from_environment()
        self._crash_after_append = (partial(crash_at, AFTER_FOLLOWER_APPEND, failpoints)
                                    if AFTER_FOLLOWER_APPEND in failpoints else None)
        self.hold_high_watermark = HOLD_HIGH_WATERMARK in failpoints

    def learn_endpoints(self, endpoints: dict[int, tuple[str, int]]) -> None:
        """The live leaders a LeaderAndIsr names (used until UpdateMetadata lists them)."""
        self._endpoints.update(endpoints)

    def endpoint(self, broker_id: int) -> tuple[str, int] | None:
        found = self.broker.metadata.broker(broker_id)
        if found is not None:
            return found.host, found.port
        return self._endpoints.get(broker_id)

    def shutting_down(self) -> None:
        """This broker is about to stop: follow nothing new (see the module docstring)."""
        self._shutting_down = True

    def follow(self, partition: Partition) -> None:
        key = (partition.topic, partition.index)
        self.unfollow([key])
        if self._shutting_down:
            log.info("not following %s-%d from broker %d in leader epoch %d: shutting down", *key,
                     partition.leader_id, partition.leader_epoch)
            return
        fetcher = self._fetchers.get(partition.leader_id)
        if fetcher is None:
            fetcher = self._fetchers[partition.leader_id] = _Fetcher(self, partition.leader_id)
        fetcher.add(key, FollowerFetchState(partition.log, partition.leader_id, partition.leader_epoch,
                                            backoff_ms=self.settings["backoff_ms"],
                                            before_high_watermark_moves=self._crash_after_append))
        self._source_of[key] = partition.leader_id
        log.info("following %s-%d from broker %d in leader epoch %d", *key, partition.leader_id,
                 partition.leader_epoch)

    def unfollow(self, keys: Iterable[TopicPartition]) -> None:
        for key in keys:
            source = self._source_of.pop(key, None)
            if source is not None:
                fetcher = self._fetchers[source]
                fetcher.remove(key)
                if fetcher.empty:
                    del self._fetchers[source]
                    fetcher.stop()

    async def stop(self) -> None:
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        self._source_of.clear()
        for fetcher in fetchers:
            fetcher.stop()
        await asyncio.gather(*(f.task for f in fetchers), return_exceptions=True)


class _Fetcher:
    """The partitions followed from one source broker and the task that fetches them."""

    def __init__(self, manager: ReplicaFetcherManager, source_id: int):
        self._manager = manager
        self.source_id = source_id
        self.states: dict[TopicPartition, FollowerFetchState] = {}
        self._wake = asyncio.Event()
        self._session = FetchSessionHandler()
        self.task = asyncio.get_running_loop().create_task(self._run())

    @property
    def empty(self) -> bool:
        return not self.states

    def add(self, key: TopicPartition, state: FollowerFetchState) -> None:
        self.states[key] = state
        self._wake.set()

    def remove(self, key: TopicPartition) -> None:
        self.states.pop(key, None)

    def stop(self) -> None:
        self.task.cancel()

    async def _run(self) -> None:
        settings = self._manager.settings
        while True:
            now = now_ms()
            phases: dict[FetchPhase, dict] = {FetchPhase.TRUNCATING: {}, FetchPhase.RESETTING: {},
                                              FetchPhase.FETCHING: {}}
            ready = {}
            for key, state in self.states.items():  # one pass: once per replication round
                if state.ready(now):
                    ready[key] = phases[state.phase][key] = state
            if not ready:
                delays = [s.delayed_until_ms - now for s in self.states.values() if s.phase is not FetchPhase.FENCED]
                self._wake.clear()
                try:  # not wait_for: it can lose the cancellation that stops this task
                    async with asyncio.timeout(max(min(delays), 1) / 1000 if delays else None):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            endpoint = self._manager.endpoint(self.source_id)
            try:
                if endpoint is None:
                    raise BrokerNotAvailable(f"no endpoint known for broker {self.source_id}")
                if phases[FetchPhase.TRUNCATING]:
                    await self._truncate(endpoint, phases[FetchPhase.TRUNCATING])
                elif phases[FetchPhase.RESETTING]:
                    await self._reset(endpoint, phases[FetchPhase.RESETTING])
                else:
                    await self._fetch(endpoint, phases[FetchPhase.FETCHING])
            except (BrokerNotAvailable, RequestTimedOut) as exc:
                log.info("replica fetcher from broker %d: %s; backing off", self.source_id, exc)
                until = now_ms() + settings["backoff_ms"]
                for state in ready.values():
                    state.delayed_until_ms = until
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica fetcher from broker %d failed; backing off", self.source_id)
                await asyncio.sleep(settings["backoff_ms"] / 1000)

    async def _send(self, endpoint: tuple[str, int], request, timeout_ms: int | None = None):
        manager = self._manager
        return await manager.client.send(self.source_id, *endpoint, request,
                                          timeout_ms or manager.settings["timeout_ms"])

    def _current(self, key: TopicPartition, state: FollowerFetchState) -> bool:
        """Whether `state` still is the partition's (no LeaderAndIsr replaced it meanwhile)."""
        return self.states.get(key) is state

    async def _truncate(self, endpoint, wanted: dict[TopicPartition, FollowerFetchState]) -> None:
        """OffsetsForLeaderEpoch v4 for each partition's latest epoch, then truncate."""
        request = epoch_request.OffsetForLeaderEpochRequest(
            replica_id=self._manager.broker.node_id,
            topics=tuple(epoch_request.OffsetForLeaderTopic(topic=topic, partitions=tuple(
                epoch_request.OffsetForLeaderPartition(partition=p, current_leader_epoch=s.current_leader_epoch,
                                                       leader_epoch=s.latest_epoch())
                for p, s in parts)) for topic, parts in _by_topic(wanted)))
        sent_at = now_ms()
        response = await self._send(endpoint, request)
        log.debug("OffsetsForLeaderEpoch from leader %d of %s answered in %d ms", self.source_id,
                  sorted(wanted)[:5], now_ms() - sent_at)
        for topic in response.topics:
            for answer in topic.partitions:
                key = (topic.topic, int(answer.partition))
                state = wanted.get(key)
                if state is None or not self._current(key, state):
                    continue
                error = ErrorCode(answer.error_code)
                truncation = state.on_epoch_end_offset(error, int(answer.leader_epoch), int(answer.end_offset),
                                                       now_ms())
                if error is not ErrorCode.none:
                    log.info("%s-%d: OffsetsForLeaderEpoch from leader %d answered %s", *key, self.source_id,
                             error.name)
                if truncation is not None:
                    log.info("%s-%d truncated to %d (leader %d's end of epoch %d)", *key, truncation.offset,
                             self.source_id, answer.leader_epoch)
                await _rebuild_producer_state(state.log)
                await asyncio.sleep(0)

    async def _reset(self, endpoint, wanted: dict[TopicPartition, FollowerFetchState]) -> None:
        """After OFFSET_OUT_OF_RANGE: the leader's log start and end (ListOffsets v7 as a replica)."""
        answers = {}
        for timestamp in (EARLIEST, LATEST):
            request = list_offsets_request.ListOffsetsRequest(
                replica_id=self._manager.broker.node_id, isolation_level=0,
                topics=tuple(list_offsets_request.ListOffsetsTopic(name=topic, partitions=tuple(
                    list_offsets_request.ListOffsetsPartition(partition_index=p,
                                                              current_leader_epoch=s.current_leader_epoch,
                                                              timestamp=timestamp)
                    for p, s in parts)) for topic, parts in _by_topic(wanted)))
            response = await self._send(endpoint, request)
            for topic in response.topics:
                for answer in topic.partitions:
                    key = (topic.name, int(answer.partition_index))
                    previous = answers.get(key, (ErrorCode.none,))
                    error = ErrorCode(answer.error_code)
                    answers[key] = (previous[0] if previous[0] is not ErrorCode.none else error,
                                    *previous[1:], int(answer.offset))
        for key, (error, *offsets) in answers.items():
            state = wanted.get(key)
            if state is not None and self._current(key, state) and len(offsets) == 2:
                state.on_leader_offsets(error, offsets[0], offsets[1], now_ms())
                await _rebuild_producer_state(state.log)

    async def _fetch(self, endpoint, wanted: dict[TopicPartition, FollowerFetchState]) -> None:
        """Fetch v12 in this fetcher's session with the leader (KIP-227): the request names only
        the partitions whose position or epochs moved, the answer only those with news."""
        settings = self._manager.settings
        session = self._session
        sent, params = {}, {}
        for key, state in wanted.items():  # one pass over every partition followed, each round
            log_ = state.log
            sent[key] = offset = log_.log_end_offset  # `state.fetch_offset`
            params[key] = (offset, state.current_leader_epoch, _or_undefined(log_.leader_epoch_cache.latest_epoch),
                           log_.log_start_offset)
        send, forget = session.build(params)
        request = fetch_request.FetchRequest(
            cluster_id=None, replica_id=self._manager.broker.node_id,
            max_wait=timedelta(milliseconds=self._max_wait_ms(wanted)), min_bytes=settings["min_bytes"],
            max_bytes=settings["max_bytes"], isolation_level=0, session_id=session.session_id,
            session_epoch=session.epoch,
            topics=tuple(fetch_request.FetchTopic(topic=topic, partitions=tuple(
                fetch_request.FetchPartition(partition=p, current_leader_epoch=leader_epoch, fetch_offset=offset,
                                             last_fetched_epoch=last_fetched_epoch, log_start_offset=log_start,
                                             partition_max_bytes=settings["partition_max_bytes"])
                for p, (offset, leader_epoch, last_fetched_epoch, log_start) in parts))
                for topic, parts in _by_topic({key: params[key] for key in send})),
            forgotten_topics_data=tuple(fetch_request.ForgottenTopic(topic=topic, partitions=tuple(p for p, _ in parts))
                                        for topic, parts in _by_topic(dict.fromkeys(forget))),
            rack_id="")
        sent_at = now_ms()
        try:
            response = await self._send(endpoint, request)
        except BaseException:
            session.handle_error()
            raise
        answered = [(topic.topic, int(data.partition_index))
                    for topic in response.responses for data in topic.partitions]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Fetch from leader %d of %s: %d partitions answered in %d ms: %s", self.source_id,
                      sorted(wanted)[:5], len(answered), now_ms() - sent_at, answered[:5])
        if not session.handle_response(ErrorCode(response.error_code), response.session_id, answered):
            log.info("Fetch from leader %d in session %d: %s; the next fetch is a full one", self.source_id,
                     request.session_id, ErrorCode(response.error_code).name)
            return
        usable = []
        for topic in response.responses:
            for data in topic.partitions:
                key = (topic.topic, int(data.partition_index))
                state = wanted.get(key)
                if state is not None and state.fetch_offset == sent[key]:
                    usable.append((key, state, data))
        written_ahead = await self._write_epoch_starts_ahead(usable)
        appended = False
        for key, state, data in usable:
            if appended and data.records:  # let requests in between appends (an empty answer costs
                await asyncio.sleep(0)  # microseconds), not after the last: the next fetch, which
                appended = False  # moves the leader's HW, waited a turn behind every ready task
            if data.records and not state.log.producer_state_ready:  # its first append since a start
                await producer_state_ready(state.log)
            if self._current(key, state) and state.fetch_offset == sent[key]:
                self._apply(key, state, data)
                await _rebuild_producer_state(state.log)  # after a diverging epoch's truncation
                appended = appended or bool(data.records)
        for target in written_ahead:  # not appended after all (no longer followed here, an error)
            target.leader_epoch_cache.flush()  # puts back what the cache holds; else writes nothing

    def _max_wait_ms(self, wanted: dict[TopicPartition, FollowerFetchState]) -> int:
        """`replica.fetch.wait.max.ms`, but no longer than until the next of this fetcher's other
        partitions is due for a request (a retry after UNKNOWN_LEADER_EPOCH or an error; a fenced
        one's LeaderAndIsr expected, `FollowerFetchState.next_request_due_ms`): the fetcher
        sends one request at a time, so a long poll of the partitions that have nothing new
        held that request back. After a controlled shutdown's leadership move, the follower's
        retry of the partition whose epoch its new leader did not know yet, or its truncation
        once the LeaderAndIsr ending a fence came, waited for an empty long poll of the others
        (500 ms), and acks=all on that partition with it: the producers' requests queued behind
        one on the same connection, so nothing came to end the poll (benchmarks/failover.py)."""
        wait = self._manager.settings["max_wait_ms"]
        if len(wanted) == len(self.states):  # all of them are asked for
            return wait
        now = now_ms()
        for key, state in self.states.items():
            if key not in wanted:
                due = state.next_request_due_ms(now)
                if due > now:
                    wait = min(wait, due - now)
        return wait

    async def _write_epoch_starts_ahead(self, usable: list) -> list:
        """The first batch of a new leader epoch makes the append write the partition's leader
        epoch checkpoint (two fsyncs); a restarted follower gets such a batch for every partition
        whose leader changed while it was away, and those fsyncs on the event loop took seconds
        for hundreds of partitions. They are written first in worker threads, so the appends find
        the files current. Returns the logs written for."""
        writes = {}
        for key, state, data in usable:
            diverging = data.diverging_epoch
            if data.error_code or not data.records or (diverging is not None and diverging.epoch >= 0):
                continue
            start = _first_new_epoch(data.records, state.latest_epoch())
            if start is not None:
                writes[key] = (state, state.log.leader_epoch_cache.assign_ahead(*start))
        if writes:
            await self._manager.broker.replicas.write_epoch_checkpoints_ahead([w for _, w in writes.values()])
        return [state.log for state, _ in writes.values()]

    def _apply(self, key: TopicPartition, state: FollowerFetchState, data) -> None:
        now = now_ms()
        error = ErrorCode(data.error_code)
        diverging = data.diverging_epoch
        try:
            if error is ErrorCode.none and diverging is not None and diverging.epoch >= 0:
                truncation = state.on_diverging_epoch(int(diverging.epoch), int(diverging.end_offset), now)
                if truncation is not None:
                    log.info("%s-%d diverged from leader %d: truncated to %d", *key, self.source_id, truncation.offset)
                return
            high_watermark = state.log.high_watermark if self._manager.hold_high_watermark else int(data.high_watermark)
            state.on_fetch_response(error, bytes(data.records or b""), high_watermark,
                                    int(data.log_start_offset), now)
        except KafkaError as exc:
            log.warning("%s-%d: cannot append what leader %d sent (%s: %s); backing off",
                        *key, self.source_id, exc.code.name, exc.message)
            state.delayed_until_ms = now + self._manager.settings["backoff_ms"]
        if error not in (ErrorCode.none, ErrorCode.offset_out_of_range):
            log.info("%s-%d: Fetch from leader %d answered %s", *key, self.source_id, error.name)


async def _rebuild_producer_state(log_) -> None:
    """The producer-state rebuild a truncation left pending, in steps with the loop turning
    between them (one step: 1,000 replayed batches); appends to the log finish it first anyway."""
    while log_.rebuild_step():
        await asyncio.sleep(0)


def _by_topic(wanted: dict[TopicPartition, object]) -> list[tuple[str, list]]:
    """(topic, [(partition, value)]) by topic name, in one pass: filtering all partitions per
    topic cost topics x partitions per request (1,000 one-partition topics: a million)."""
    grouped: dict[str, list] = {}
    for (topic, partition), state in wanted.items():
        grouped.setdefault(topic, []).append((partition, state))
    return sorted(grouped.items())


def _first_new_epoch(records, latest_epoch: int | None) -> tuple[int, int] | None:
    """(epoch, base offset) of the first batch stamped with a leader epoch newer than
    `latest_epoch`, walking only the batches' length fields (the append validates them)."""
    position, end = 0, len(records)
    while position + HEADER_SIZE <= end:
        base_offset, length = _BASE_AND_LENGTH.unpack_from(records, position)
        epoch = _EPOCH.unpack_from(records, position + PARTITION_LEADER_EPOCH_OFFSET)[0]
        if epoch >= 0 and (latest_epoch is None or epoch > latest_epoch):
            return epoch, base_offset
        if length <= 0:
            return None
        position += LOG_OVERHEAD + length
    return None


def _or_undefined(epoch: int | None) -> int:
    return -1 if epoch is None else epoch
