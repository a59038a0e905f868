"""The asyncio edge of the group coordinator: `__consumer_offsets` as its store, and its timer.

`GroupCoordinator` is a pure state machine; this module creates the compacted internal
topic, hands the coordinator the topic's partitions as its `OffsetsStore`, loads them at
start and runs `poll` on a short tick. For the group API handlers it has the ACL check and
a future to await for replies that wait (JoinGroup, SyncGroup, commits).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from ...errors import ErrorCode, KafkaError
from ...records.control import ABORT, COMMIT, control_type
from ...records.records import Record, build_batch, iter_batches
from ...server.data_sync import DataSync
from .api import OnDurable, StoredRecord, StoredTxnMarker
from .coordinator import GroupCoordinator
from .records import OFFSETS_TOPIC

if TYPE_CHECKING:
    from ...server.broker import Broker

log = logging.getLogger("ottla.group")

_LOAD_CHUNK_BYTES = 1 << 20
# Timers need no more precision than this: Kafka's own delayed operations are best effort.
_TICK_S = 0.05


class OffsetsLogStore:
    """`OffsetsStore` over the broker's `__consumer_offsets` logs.

    One node holds the only copy, so durable means fdatasynced (`DataSync`) before anyone
    is answered.
    """

    def __init__(self, broker: "Broker", clock: Callable[[], int]):
        self._broker = broker
        self._clock = clock
        self._sync = DataSync(broker.logs, OFFSETS_TOPIC)

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], on_durable: OnDurable,
               *, producer_id: int = -1, producer_epoch: int = -1) -> None:
        now = self._clock()
        batch = build_batch([Record(key, value, (), now) for key, value in records], producer_id=producer_id,
                            producer_epoch=producer_epoch, is_transactional=producer_id >= 0, now_ms=now)
        try:
            result = self._broker.append(OFFSETS_TOPIC, partition, batch, now=now, origin="coordinator")
        except KafkaError as exc:
            on_durable(exc.code, -1)
            return
        except Exception:  # the coordinator answers its client whatever the store did
            log.exception("append to %s-%d failed", OFFSETS_TOPIC, partition)
            on_durable(ErrorCode.kafka_storage_error, -1)
            return
        base_offset = result.base_offset
        self._sync.after_sync(partition, lambda error: on_durable(
            error, base_offset if error == ErrorCode.none else -1))

    def close(self) -> None:
        """Sync and answer the appends not yet acknowledged."""
        self._sync.close()

    def load(self, partition: int) -> Iterator[StoredRecord | StoredTxnMarker]:
        partition_log = self._broker.logs.get_log(OFFSETS_TOPIC, partition)
        end = partition_log.log_end_offset
        offset = partition_log.log_start_offset
        while offset < end:
            data = partition_log.read(offset, _LOAD_CHUNK_BYTES, max_offset=end).records
            batches = list(iter_batches(data))
            if not batches:
                break
            for header, records in batches:
                if header.is_control:
                    kind = control_type(records[0].key) if records else None
                    if kind in (ABORT, COMMIT):
                        yield StoredTxnMarker(header.base_offset, header.producer_id, kind == COMMIT)
                else:
                    producer_id = header.producer_id if header.is_transactional else -1
                    for record in records:
                        if record.key is not None:
                            yield StoredRecord(record.offset, record.key, record.value, producer_id)
                offset = header.last_offset + 1


class GroupService:
    """Creates `__consumer_offsets`, loads every partition (one node leads them all) and
    runs the coordinator's timers."""

    def __init__(self, broker: "Broker", clock: Callable[[], int]):
        self._broker = broker
        self._clock = clock
        existing = broker.logs.topics.get(OFFSETS_TOPIC)
        self._store = OffsetsLogStore(broker, clock)
        self.coordinator = GroupCoordinator(broker.config, self._store,
                                            num_partitions=existing.partitions if existing else None)
        self._timer: asyncio.Task | None = None

    async def start(self) -> None:
        config = self._broker.config
        logs = self._broker.logs
        partitions = self.coordinator.num_partitions
        if OFFSETS_TOPIC not in logs.topics:
            logs.create_topic(OFFSETS_TOPIC, partitions, {
                "cleanup.policy": "compact",
                "compression.type": "producer",
                "segment.bytes": config["offsets.topic.segment.bytes"],
            })
        elif partitions != config["offsets.topic.num.partitions"]:
            log.warning("%s has %d partitions; offsets.topic.num.partitions=%d applies only to a new topic",
                        OFFSETS_TOPIC, partitions, config["offsets.topic.num.partitions"])
        for partition in range(partitions):
            self.coordinator.load_partition(partition, self._clock())
        log.info("loaded %d groups from %s", len(self.coordinator.list_groups().groups), OFFSETS_TOPIC)
        self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def _run_timer(self) -> None:
        while True:
            try:
                self.coordinator.poll(self._clock())
            except Exception:
                # A bug must not stop every other group's session and rebalance timers for good.
                log.exception("group coordinator timer failed")
            await asyncio.sleep(_TICK_S)

    def complete_txn(self, producer_id: int, commit: bool, partitions: Iterable[int]) -> None:
        """The producer's COMMIT/ABORT marker is now in these `__consumer_offsets` partitions."""
        self.coordinator.complete_txn(producer_id=producer_id, partitions=partitions, commit=commit,
                                      now_ms=self._clock())

    def stop(self) -> None:
        """Acknowledge what is already written, then answer waiting members NOT_COORDINATOR so
        they look for the coordinator again once the broker is back."""
        if self._timer is not None:
            self._timer.cancel()
        self._store.close()
        now = self._clock()
        for partition in range(self.coordinator.num_partitions):
            self.coordinator.unload_partition(partition, now)
