"""The asyncio edge of the transaction coordinator: its log, its markers and its timer.

`TransactionCoordinator` is a pure state machine; this module gives it the
`__transaction_state` partitions (through the `CoordinatorRuntime`) as its `TxnLogStore`, a
`MarkerWriter` that hands markers to the `MarkerChannel` and retries them, and a task that
calls `poll`. A partition is loaded when this broker becomes its leader, with the leader
epoch as the coordinator epoch, and unloaded when it stops leading it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from ...errors import DataDirError, ErrorCode
from ...failpoints import crash_at
from ...failpoints import from_environment as failpoints_from_environment
from ...records.batch import CONTROL_BIT
from ...records.records import Record, build_batch
from ...records.scan import scan_batches
from ..runtime import CoordinatorRuntime, MarkerChannel
from .coordinator import TransactionCoordinator
from .log_format import TRANSACTION_STATE_TOPIC, TopicPartition
from .metadata import TxnMetadata, loaded_txns

log = logging.getLogger("ottla.txn")

_MARKER_RETRY_MIN_S = 0.05
_MARKER_RETRY_MAX_S = 1.0
# The coordinator epoch or the producer epoch moved on: the completion is someone else's now.
_MARKER_FENCED = frozenset({ErrorCode.transaction_coordinator_fenced, ErrorCode.invalid_producer_epoch})


class TransactionLogStore:
    """`TxnLogStore` over the `__transaction_state` partitions, through the runtime: a state
    change is answered once the runtime says its record is durable."""

    def __init__(self, runtime: CoordinatorRuntime, clock: Callable[[], int]):
        self._runtime = runtime
        self._clock = clock
        self._loads: dict[int, Callable[[], None]] = {}  # partition -> cancels its load

    def append(self, partition: int, key: bytes, value: bytes | None,
               on_durable: Callable[[ErrorCode], None]) -> None:
        now = self._clock()
        batch = build_batch([Record(key, value, (), now)], now_ms=now)
        self._runtime.append(TRANSACTION_STATE_TOPIC, partition, batch, lambda error, _offset: on_durable(error))

    def load(self, partition: int, on_loaded: Callable[[Mapping[str, TxnMetadata]], None]) -> None:
        """Through the runtime, off the event loop (requests meanwhile get
        COORDINATOR_LOAD_IN_PROGRESS): only each key's last record is kept, as bytes, and
        decoded at the end in the load's thread too (100,000 ids: 1.9 s of CPU); the loop only
        takes the result. A load still running for the partition (an earlier leader epoch) is
        cancelled."""
        self.cancel_load(partition)
        latest: dict[bytes, bytes | None] = {}
        decoded: list[dict[str, TxnMetadata]] = []

        def replay(records: bytes) -> None:
            for _, _, attributes, _, batch in scan_batches(records):
                if not attributes & CONTROL_BIT:
                    for _, key, value in batch:
                        if key is not None:
                            latest.pop(key, None)  # keeps the keys in the order of their last record
                            latest[key] = value

        def prepare() -> None:
            decoded.append(loaded_txns(latest.items()))

        def loaded() -> None:
            self._loads.pop(partition, None)
            on_loaded(decoded[0])

        self._loads[partition] = self._runtime.load(TRANSACTION_STATE_TOPIC, partition, replay, loaded, prepare)

    def cancel_load(self, partition: int) -> None:
        cancel = self._loads.pop(partition, None)
        if cancel is not None:
            cancel()


class MarkerSender:
    """`MarkerWriter` over the `MarkerChannel`: sends WriteTxnMarkers to each partition's leader
    and retries each partition until it has its marker, as Kafka's marker channel does."""

    def __init__(self, channel: MarkerChannel, runtime: CoordinatorRuntime, failpoints: frozenset[str] = frozenset()):
        self._channel = channel
        self._runtime = runtime
        self._tasks: set[asyncio.Task] = set()
        self._failpoints = failpoints
        self._crash_after_prepare_commit = "txn.after_prepare_commit" in failpoints  # checked per commit

    def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                      commit: bool, partitions: frozenset[TopicPartition],
                      on_done: Callable[[ErrorCode], None], transaction_version: int = 0) -> None:
        if commit and self._crash_after_prepare_commit:
            crash_at("txn.after_prepare_commit", self._failpoints)
        task = asyncio.get_running_loop().create_task(
            self._send(producer_id, producer_epoch, coordinator_epoch, commit, set(partitions), on_done,
                       transaction_version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                    remaining: set[TopicPartition], on_done: Callable[[ErrorCode], None],
                    transaction_version: int) -> None:
        delay = _MARKER_RETRY_MIN_S
        while remaining:
            try:
                outcomes = await self._channel.write_txn_markers(producer_id, producer_epoch, coordinator_epoch,
                                                                 commit, frozenset(remaining), transaction_version)
            except Exception:
                log.exception("WriteTxnMarkers for producer %d failed; retrying", producer_id)
                await asyncio.sleep(_MARKER_RETRY_MAX_S)
                continue
            for tp, error in outcomes.items():
                if error in _MARKER_FENCED:
                    on_done(error)
                    return
                # A deleted topic needs no marker (Kafka drops those partitions from the request too).
                if error is ErrorCode.none or not self._runtime.topic_exists(tp[0]):
                    remaining.discard(tp)
                else:
                    log.info("marker for producer %d on %s-%d failed with %s; retrying",
                             producer_id, tp[0], tp[1], error.name)
            if remaining:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MARKER_RETRY_MAX_S)
        on_done(ErrorCode.none)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class TransactionService:
    """Creates `__transaction_state`, loads the partitions this broker leads and runs the
    coordinator's timer. The coordinator epoch of a partition is the leader epoch at which this
    broker became its leader (a later epoch on the same leader keeps it, as in Kafka)."""

    def __init__(self, runtime: CoordinatorRuntime, channel: MarkerChannel, config: Mapping[str, Any],
                 next_producer_id: Callable[[], int], clock: Callable[[], int]):
        self._runtime = runtime
        self._config = config
        self._clock = clock
        self.markers = MarkerSender(channel, runtime, failpoints_from_environment())
        self._store = TransactionLogStore(runtime, clock)
        self.coordinator = TransactionCoordinator(config, self._store, self.markers, next_producer_id)
        self._timer: asyncio.Task | None = None
        self._loaded: set[int] = set()

    async def start(self) -> None:
        config = self._config
        partitions = self._runtime.ensure_topic(TRANSACTION_STATE_TOPIC, config["transaction.state.log.num.partitions"], {
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "segment.bytes": config["transaction.state.log.segment.bytes"],
        })
        if partitions != self.coordinator.num_partitions:
            # Kafka refuses too: ids would be looked up in the wrong partitions.
            raise DataDirError(f"{TRANSACTION_STATE_TOPIC} has {partitions} partitions but "
                               f"transaction.state.log.num.partitions is {self.coordinator.num_partitions}: "
                               f"start with transaction.state.log.num.partitions={partitions}")
        self._runtime.watch_leadership(TRANSACTION_STATE_TOPIC, self._on_elected, self._on_resigned)
        self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    def _on_elected(self, partition: int, leader_epoch: int) -> None:
        self._loaded.add(partition)
        self.coordinator.load_partition(partition, leader_epoch, self._clock())

    def _on_resigned(self, partition: int, leader_epoch: int) -> None:
        if partition in self._loaded:
            self._loaded.discard(partition)
            self._store.cancel_load(partition)
            self.coordinator.unload_partition(partition)

    async def _run_timer(self) -> None:
        interval_ms = self._config["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
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
        self._runtime.close(TRANSACTION_STATE_TOPIC)
        self.markers.cancel_all()
        for partition in sorted(self._loaded):
            self._on_resigned(partition, -1)
