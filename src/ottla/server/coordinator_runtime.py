"""The server's side of the coordinator seams (`coordinator/runtime.py`).

`BrokerCoordinatorRuntime` gives the coordinators their internal topics: appends as the
partition's leader through the replica manager, acknowledged once durable, and leadership
changes from the replica manager. Durable means: with one replica, fdatasynced (`DataSync`);
with several, past the high watermark, i.e. on every ISR member (as Kafka, which does not
fsync either: a record on the ISR survives any single crash).
`BrokerMarkerChannel` sends WriteTxnMarkers to each partition's leader (at the highest version
both brokers serve, from the leader's ApiVersions): this broker is
served in-process through the same handler a remote coordinator's request reaches; other
leaders get the request over the inter-broker client.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from ..controller import admin
from ..coordinator.group.records import OFFSETS_TOPIC
from ..coordinator.runtime import OnDurable, OnLeadership, TopicPartition
from ..coordinator.transaction.log_format import TRANSACTION_STATE_TOPIC
from ..errors import ErrorCode, KafkaError
from ..log.file_records import FileRecords, RecordsGone
from ..protocol.build import make, nested
from ..protocol.schemas import request_schema
from ..records.batch import LOG_OVERHEAD
from .clock import now_ms
from .context import RequestContext
from .data_sync import DataSync
from .handlers import write_txn_markers
from .interbroker import BrokerNotAvailable, InterBrokerClient, RequestTimedOut, UnsupportedVersion
from .steps import producer_state_ready

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("ottla.coordinator")

_BASE_AND_LENGTH = struct.Struct(">qi")
_I32 = struct.Struct(">i")
_LAST_OFFSET_DELTA = 23  # where a v2 batch header keeps last_offset_delta
_REPLICATION_FACTOR = {OFFSETS_TOPIC: "offsets.topic.replication.factor",
                       TRANSACTION_STATE_TOPIC: "transaction.state.log.replication.factor"}
# One thread reads and replays the loads (one partition's record sets in order, partitions one
# after the other): on the loop, the survivors of 100,000 offsets were decoded in one step of
# 1.1-1.2 s of CPU, and a cold disk's reads were the loop's waits.
_LOADS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ottla-coordinator-load")


class BrokerCoordinatorRuntime:
    # Record-set size a load reads and replays per hand-over to its thread (`_LOADS`).
    load_chunk_bytes = 256 * 1024

    def __init__(self, broker: "Broker"):
        self._broker = broker
        self._syncs: dict[str, DataSync] = {}
        self._watchers: dict[str, tuple[OnLeadership, OnLeadership]] = {}
        # Cluster: the internal topics to create on demand, (partitions, configs), and the
        # creations under way.
        self._internal: dict[str, tuple[int, dict]] = {}
        self._creating: dict[str, asyncio.Future] = {}
        broker.replicas.add_leadership_listener(self._on_leadership)

    def ensure_topic(self, topic: str, partitions: int, configs: Mapping[str, Any]) -> int:
        existing = self._broker.metadata.topic(topic)
        if existing is not None:
            return existing.partition_count
        if self._broker.membership is not None:
            # A cluster creates it through the store on the first FindCoordinator that needs
            # it (`create_internal_topic`), as Kafka does; until then its configured size.
            self._internal[topic] = (partitions, dict(configs))
            return partitions
        local = self._broker.logs.topics.get(topic)
        if local is not None:
            return local.partitions
        return self._broker.create_topic(topic, partitions, dict(configs)).partitions

    async def create_internal_topic(self, topic: str) -> None:
        """Cluster: create `topic` through the store (once at a time per broker) with its
        replication factor; raises a KafkaError (INVALID_REPLICATION_FACTOR while fewer live
        brokers than the factor) that FindCoordinator answers as COORDINATOR_NOT_AVAILABLE."""
        if topic not in self._internal or self._broker.metadata.has_topic(topic):
            return
        running = self._creating.get(topic)
        if running is None:
            running = self._creating[topic] = asyncio.ensure_future(self._create(topic))
            running.add_done_callback(lambda _: self._creating.pop(topic, None))
        await asyncio.shield(running)

    async def _create(self, topic: str) -> None:
        partitions, configs = self._internal[topic]
        factor = self._broker.config[_REPLICATION_FACTOR[topic]]
        store = self._broker.membership.store
        live = len(await asyncio.to_thread(store.live_brokers))
        if live < factor:
            raise KafkaError(ErrorCode.invalid_replication_factor,
                             f"Number of alive brokers '{live}' does not meet the required replication factor "
                             f"'{factor}' for {topic} (configured via '{_REPLICATION_FACTOR[topic]}'). This "
                             "error can be ignored if the cluster is starting up and not all brokers are up yet.")
        # transaction.state.log.min.isr (Kafka's, default 2), capped by the factor; 2 for the
        # offsets topic too, so a commit is on two brokers when there are two to hold it.
        min_isr = self._broker.config["transaction.state.log.min.isr"] if topic == TRANSACTION_STATE_TOPIC else 2
        configs = {**configs, "min.insync.replicas": min(min_isr, factor)}
        try:
            planned = await asyncio.to_thread(admin.plan_topic, store, topic, partitions, factor)
            await asyncio.to_thread(admin.create_topic, store, planned, configs)
            log.info("created %s with %d partitions, replication factor %d", topic, partitions, factor)
        except KafkaError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise

    def partition_count(self, topic: str) -> int | None:
        info = self._broker.metadata.topic(topic)
        return info.partition_count if info is not None else None

    def topic_exists(self, topic: str) -> bool:
        return self._broker.metadata.has_topic(topic)

    # -- leadership ----------------------------------------------------------------------

    def watch_leadership(self, topic: str, on_elected: OnLeadership, on_resigned: OnLeadership) -> None:
        self._watchers[topic] = (on_elected, on_resigned)
        for (name, index), partition in sorted(self._broker.replicas.partitions.items()):
            if name == topic and partition.is_leader:
                on_elected(index, partition.leader_epoch)

    def _on_leadership(self, topic: str, partition: int, is_leader: bool, leader_epoch: int) -> None:
        watcher = self._watchers.get(topic)
        if watcher is not None:
            (watcher[0] if is_leader else watcher[1])(partition, leader_epoch)

    # -- appends and loads ---------------------------------------------------------------

    def append(self, topic: str, partition: int, records: bytes, on_durable: OnDurable) -> None:
        replicas = self._broker.replicas
        try:
            result = replicas.append(topic, partition, records, now_ms=now_ms(), origin="coordinator")
        except KafkaError as exc:
            on_durable(exc.code, -1)
            return
        except Exception:  # the coordinator answers its client whatever the append did
            log.exception("append to %s-%d failed", topic, partition)
            on_durable(ErrorCode.kafka_storage_error, -1)
            return
        base_offset, end = result.base_offset, result.last_offset + 1

        def replicated(error: ErrorCode) -> None:
            on_durable(error, base_offset if error == ErrorCode.none else -1)

        target = replicas.get_partition(topic, partition)
        if target is not None and len(target.replicas) > 1:
            replicas.after_high_watermark(topic, partition, end, replicated)
            return

        def synced(error: ErrorCode) -> None:
            if error != ErrorCode.none:
                on_durable(error, -1)
            else:
                replicas.after_high_watermark(topic, partition, end, replicated)

        sync = self._syncs.get(topic)
        if sync is None:
            sync = self._syncs[topic] = DataSync(self._broker.logs, topic)
        sync.after_sync(partition, synced)

    def read(self, topic: str, partition: int) -> Iterator[bytes]:
        partition_log = self._broker.logs.get_log(topic, partition)
        end = partition_log.log_end_offset
        offset = partition_log.log_start_offset
        while offset < end:
            records = bytes(partition_log.read(offset, self.load_chunk_bytes, max_offset=end).records)
            if not records:
                return
            yield records
            offset = _next_offset(records)

    def load(self, topic: str, partition: int, replay: Callable[[bytes], None],
             on_loaded: Callable[[], None], prepare: Callable[[], None] | None = None) -> Callable[[], None]:
        task = asyncio.get_running_loop().create_task(self._load(topic, partition, replay, on_loaded, prepare))
        return task.cancel

    async def _load(self, topic: str, partition: int, replay: Callable[[bytes], None],
                    on_loaded: Callable[[], None], prepare: Callable[[], None] | None) -> None:
        """Where each record set lies is found on the loop (the log is the loop's); reading it
        (on a duplicate of the descriptor, as a cold Fetch's read) and replaying it happen in
        `_LOADS`, then `prepare` there too; `on_loaded` on the loop."""
        started, loaded_bytes = time.monotonic(), 0
        loop = asyncio.get_running_loop()
        try:
            partition_log = self._broker.logs.get_log(topic, partition)
            await producer_state_ready(partition_log)  # a read asks for the LSO: loaded in steps
            end = partition_log.log_end_offset
            offset = partition_log.log_start_offset
            while offset < end:
                records = partition_log.read(offset, self.load_chunk_bytes, max_offset=end, lazy=True).records
                if not records:
                    break
                read = records.detached_read(0, len(records)) if isinstance(records, FileRecords) else records
                offset = await loop.run_in_executor(_LOADS, _replay_chunk, read, len(records), replay)
                loaded_bytes += len(records)
            if prepare is not None and loaded_bytes:
                await loop.run_in_executor(_LOADS, prepare)
            elif prepare is not None:
                prepare()  # nothing was replayed: an empty partition loads in one step, as at start
            on_loaded()
            if loaded_bytes:
                log.info("finished loading %s-%d (%d bytes) in %d ms", topic, partition, loaded_bytes,
                         (time.monotonic() - started) * 1000)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loading %s-%d failed", topic, partition)

    def close(self, topic: str) -> None:
        sync = self._syncs.pop(topic, None)
        if sync is not None:
            sync.close()


class BrokerMarkerChannel:
    """WriteTxnMarkers to each partition's leader, per the metadata cache: one request per
    leader, all in parallel; this broker's own partitions in-process."""

    def __init__(self, broker: "Broker", client: InterBrokerClient):
        self._broker = broker
        self._client = client

    async def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                                partitions: frozenset[TopicPartition],
                                transaction_version: int = 0) -> dict[TopicPartition, ErrorCode]:
        metadata = self._broker.metadata
        outcomes: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, dict[str, list[int]]] = {}
        for topic, index in sorted(partitions):
            leader = metadata.leader(topic, index)
            if leader is not None:
                by_leader.setdefault(leader.node_id, {}).setdefault(topic, []).append(index)
            elif metadata.partition(topic, index) is None:
                outcomes[(topic, index)] = ErrorCode.unknown_topic_or_partition
            else:
                outcomes[(topic, index)] = ErrorCode.not_leader_or_follower  # offline: retried
        sends = []
        for node_id, topics in by_leader.items():
            marker = dict(producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
                          coordinator_epoch=coordinator_epoch, topics=topics)
            if node_id == self._broker.node_id:
                version = write_txn_markers.VERSIONS[1]
                ctx = RequestContext(self._broker, write_txn_markers.API_KEY, version, None, "transaction-coordinator")
                _collect(outcomes, await write_txn_markers.write_markers(
                    ctx, _markers_request(version, marker, transaction_version)))
            else:
                sends.append(self._send(metadata.broker(node_id), marker, transaction_version, outcomes))
        if sends:
            await asyncio.gather(*sends)
        return outcomes

    async def _send(self, leader, marker: dict, transaction_version: int,
                    outcomes: dict[TopicPartition, ErrorCode]) -> None:
        """Markers to another broker at the highest version both serve, as Kafka's coordinator
        sends what its NetworkClient negotiated (v2 between Ottla brokers, v1 to a Kafka 3.x:
        a version-2 marker then goes without its version, its bumped epoch still above the
        partition's)."""
        try:
            version = await self._client.usable_version(leader.node_id, leader.host, leader.port,
                                                        write_txn_markers.API_KEY, write_txn_markers.VERSIONS)
            request = _markers_request(version, marker, transaction_version)
            _collect(outcomes, await self._client.send(leader.node_id, leader.host, leader.port, request))
        except (BrokerNotAvailable, RequestTimedOut, UnsupportedVersion) as exc:
            log.info("WriteTxnMarkers to broker %d failed: %s", leader.node_id, exc)
            error = ErrorCode.request_timed_out if isinstance(exc, RequestTimedOut) else ErrorCode.network_exception
            outcomes.update({(t, p): error for t, indexes in marker["topics"].items() for p in indexes})


def _markers_request(version: int, marker: dict, transaction_version: int):
    """WriteTxnMarkers of `version` for one marker: v2 states the transaction's version
    (`transaction_version`, 2 for KIP-890 part 2); v1 carries the same marker without it."""
    schema = request_schema(write_txn_markers.API_KEY, version)
    marker_type, topic_type = nested(schema, "WritableTxnMarker"), nested(schema, "WritableTxnMarkerTopic")
    topics = tuple(make(topic_type, name=t, partition_indexes=tuple(p)) for t, p in marker["topics"].items())
    return schema(markers=(make(marker_type, **{**marker, "topics": topics}, transaction_version=transaction_version),))


def _replay_chunk(read: Callable[[], bytes] | bytes | memoryview, length: int,
                  replay: Callable[[bytes], None]) -> int:
    """In `_LOADS`: read one record set (`read` made on the loop), replay it; the offset after it."""
    records = read() if callable(read) else bytes(read)
    if len(records) != length:  # cut short under the read (a truncation): the load fails
        raise RecordsGone(f"read {len(records)} of {length} bytes")
    replay(records)
    return _next_offset(records)


def _next_offset(records: bytes) -> int:
    """The offset after the last batch of `records` (whole batches, as `Log.read` returns them)."""
    position = last = 0
    end = len(records)
    unpack = _BASE_AND_LENGTH.unpack_from
    while position < end:
        last = position
        position += unpack(records, position)[1] + LOG_OVERHEAD
    base_offset = unpack(records, last)[0]
    return base_offset + _I32.unpack_from(records, last + _LAST_OFFSET_DELTA)[0] + 1


def _collect(outcomes: dict[TopicPartition, ErrorCode], response) -> None:
    for topic_result in response.markers[0].topics:
        for result in topic_result.partitions:
            outcomes[(topic_result.name, result.partition_index)] = result.error_code
