"""The asyncio edge of the transaction coordinator: its log, its markers and its timer.

`TransactionCoordinator` is a pure state machine; this module gives it the broker's
`__transaction_state` partitions as its `TxnLogStore`, the WriteTxnMarkers request path as its
`MarkerWriter`, and a task that calls `poll`. The markers go through the same request and
handler a remote coordinator would use, so the single-node path is the multi-broker path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING, Callable

from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
)

from ...errors import ErrorCode, KafkaError
from ...records.records import Record, build_batch, iter_batches
from ...server.context import RequestContext
from ...server.data_sync import DataSync
from ...server.handlers import write_txn_markers
from .coordinator import Records, TransactionCoordinator
from .log_format import TRANSACTION_STATE_TOPIC, TopicPartition

if TYPE_CHECKING:
    from ...server.broker import Broker

log = logging.getLogger("ottla.txn")

_LOAD_CHUNK_BYTES = 1 << 20
_MARKER_RETRY_MIN_S = 0.05
_MARKER_RETRY_MAX_S = 1.0
# The coordinator epoch or the producer epoch moved on: the completion is someone else's now.
_MARKER_FENCED = frozenset({ErrorCode.transaction_coordinator_fenced, ErrorCode.invalid_producer_epoch})


def _failpoints() -> frozenset[str]:
    """Crash points for process-level tests, from `OTTLA_FAILPOINTS` (comma-separated), read once
    when the broker starts so an unset variable costs nothing on the transaction path.

    `txn.after_prepare_commit`: SIGKILL this process once a PrepareCommit record is durable
    and before any COMMIT marker is written -- the coordinator crash that recovery must roll
    forward from the log.
    """
    return frozenset(name.strip() for name in os.environ.get("OTTLA_FAILPOINTS", "").split(",") if name.strip())


class TransactionLogStore:
    """`TxnLogStore` over the broker's `__transaction_state` logs.

    On one node the log is the only copy, so "durable" means fdatasynced (`DataSync`)
    before anyone is told.
    """

    def __init__(self, broker: "Broker", clock: Callable[[], int]):
        self._broker = broker
        self._clock = clock
        self._sync = DataSync(broker.logs, TRANSACTION_STATE_TOPIC)

    def append(self, partition: int, key: bytes, value: bytes | None,
               on_durable: Callable[[ErrorCode], None]) -> None:
        now = self._clock()
        batch = build_batch([Record(key, value, (), now)], now_ms=now)
        try:
            self._broker.append(TRANSACTION_STATE_TOPIC, partition, batch, now=now, origin="coordinator")
        except KafkaError as exc:
            on_durable(exc.code)
            return
        except Exception:  # the coordinator answers its client whatever the store did
            log.exception("append to %s-%d failed", TRANSACTION_STATE_TOPIC, partition)
            on_durable(ErrorCode.kafka_storage_error)
            return
        self._sync.after_sync(partition, on_durable)

    def close(self) -> None:
        """Sync and answer the appends not yet acknowledged; from now on nothing is answered."""
        self._sync.close()

    def load(self, partition: int, on_loaded: Callable[[Records], None]) -> None:
        on_loaded(self._read_all(partition))

    def _read_all(self, partition: int) -> list[tuple[bytes, bytes | None]]:
        partition_log = self._broker.logs.get_log(TRANSACTION_STATE_TOPIC, partition)
        end = partition_log.log_end_offset
        offset = partition_log.log_start_offset
        records = []
        while offset < end:
            data = partition_log.read(offset, _LOAD_CHUNK_BYTES, max_offset=end).records
            batches = list(iter_batches(data))
            if not batches:
                break
            for header, batch_records in batches:
                if not header.is_control:
                    records.extend((r.key, r.value) for r in batch_records if r.key is not None)
                offset = header.last_offset + 1
        return records


class MarkerSender:
    """`MarkerWriter` that sends WriteTxnMarkers to the partitions' leader (here: this broker)
    and retries each partition until it has its marker, as Kafka's marker channel does."""

    def __init__(self, broker: "Broker", failpoints: frozenset[str] = frozenset()):
        self._broker = broker
        self._tasks: set[asyncio.Task] = set()
        self._crash_after_prepare_commit = "txn.after_prepare_commit" in failpoints

    def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                      commit: bool, partitions: frozenset[TopicPartition],
                      on_done: Callable[[ErrorCode], None]) -> None:
        if commit and self._crash_after_prepare_commit:
            os.kill(os.getpid(), signal.SIGKILL)
        task = asyncio.get_running_loop().create_task(
            self._send(producer_id, producer_epoch, coordinator_epoch, commit, set(partitions), on_done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                    remaining: set[TopicPartition], on_done: Callable[[ErrorCode], None]) -> None:
        delay = _MARKER_RETRY_MIN_S
        while remaining:
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(remaining):
                by_topic.setdefault(topic, []).append(index)
            request = WriteTxnMarkersRequest(markers=(WritableTxnMarker(
                producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
                topics=tuple(WritableTxnMarkerTopic(name=t, partition_indexes=tuple(p)) for t, p in by_topic.items()),
                coordinator_epoch=coordinator_epoch),))
            ctx = RequestContext(self._broker, write_txn_markers.API_KEY, 1, None, "transaction-coordinator")
            try:
                response = await write_txn_markers.write_markers(ctx, request)
            except Exception:
                log.exception("WriteTxnMarkers for producer %d failed; retrying", producer_id)
                await asyncio.sleep(_MARKER_RETRY_MAX_S)
                continue
            for topic_result in response.markers[0].topics:
                for result in topic_result.partitions:
                    tp = (topic_result.name, result.partition_index)
                    error = result.error_code
                    if error in _MARKER_FENCED:
                        on_done(error)
                        return
                    if error is ErrorCode.none or not self._topic_exists(tp[0]):
                        remaining.discard(tp)
                    else:
                        log.info("marker for producer %d on %s-%d failed with %s; retrying",
                                 producer_id, tp[0], tp[1], error.name)
            if remaining:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MARKER_RETRY_MAX_S)
        on_done(ErrorCode.none)

    def _topic_exists(self, topic: str) -> bool:
        # A deleted topic needs no marker (Kafka drops those partitions from the request too).
        return topic in self._broker.logs.topics

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class TransactionService:
    """Creates `__transaction_state`, loads its partitions and runs the coordinator's timer.

    One node leads every partition; the coordinator epoch is the partition leader epoch,
    which a single node never changes (0).
    """

    COORDINATOR_EPOCH = 0

    def __init__(self, broker: "Broker", next_producer_id: Callable[[], int], clock: Callable[[], int]):
        self._broker = broker
        self._clock = clock
        self.markers = MarkerSender(broker, _failpoints())
        self._store = TransactionLogStore(broker, clock)
        self.coordinator = TransactionCoordinator(broker.config, self._store, self.markers, next_producer_id)
        self._timer: asyncio.Task | None = None

    async def start(self) -> None:
        config = self._broker.config
        if TRANSACTION_STATE_TOPIC not in self._broker.logs.topics:
            self._broker.logs.create_topic(TRANSACTION_STATE_TOPIC, config["transaction.state.log.num.partitions"], {
                "cleanup.policy": "compact",
                "compression.type": "uncompressed",
                "segment.bytes": config["transaction.state.log.segment.bytes"],
            })
        partitions = self._broker.logs.topics[TRANSACTION_STATE_TOPIC].partitions
        if partitions != self.coordinator.num_partitions:
            # Kafka refuses too: ids would be looked up in the wrong partitions.
            raise RuntimeError(f"{TRANSACTION_STATE_TOPIC} has {partitions} partitions but "
                               f"transaction.state.log.num.partitions is {self.coordinator.num_partitions}")
        for partition in range(partitions):
            self.coordinator.load_partition(partition, self.COORDINATOR_EPOCH, self._clock())
        self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def _run_timer(self) -> None:
        interval_ms = self._broker.config["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
        while True:
            now = self._clock()
            try:
                next_ms = self.coordinator.poll(now)
            except Exception:
                # A bug must not stop every other transaction's timeout for good.
                log.exception("transaction coordinator timer failed")
                next_ms = now + interval_ms
            await asyncio.sleep(max(0, next_ms - now) / 1000)

    def stop(self) -> None:
        """Stop the timer and the marker retries; whatever was decided but not completed is
        rolled forward by the next start, from the log."""
        if self._timer is not None:
            self._timer.cancel()
        self._store.close()
        self.markers.cancel_all()
        for partition in range(self.coordinator.num_partitions):
            self.coordinator.unload_partition(partition)
