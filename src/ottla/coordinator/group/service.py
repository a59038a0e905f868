"""The asyncio edge of the group coordinator: `__consumer_offsets` as its store, and its timer.

`GroupCoordinator` is a pure state machine; this module creates the compacted internal
topic through the `CoordinatorRuntime`, hands the coordinator the topic's partitions as its
`OffsetsStore`, loads a partition when this broker becomes its leader and unloads it when
it stops leading it, and runs `poll` when the coordinator's next deadline is due (one
timer, re-armed whenever an earlier deadline is scheduled), so a session expires when it
times out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ...records.records import Record, build_batch
from ..runtime import CoordinatorRuntime
from .api import OnDurable
from .coordinator import GroupCoordinator
from .records import OFFSETS_TOPIC

log = logging.getLogger("ottla.group")


class OffsetsLogStore:
    """`OffsetsStore` over the `__consumer_offsets` partitions, through the runtime: a commit
    is answered once the runtime says its batch is durable."""

    def __init__(self, runtime: CoordinatorRuntime, clock: Callable[[], int]):
        self._runtime = runtime
        self._clock = clock

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], on_durable: OnDurable,
               *, producer_id: int = -1, producer_epoch: int = -1) -> None:
        now = self._clock()
        batch = build_batch([Record(key, value, (), now) for key, value in records], producer_id=producer_id,
                            producer_epoch=producer_epoch, is_transactional=producer_id >= 0, now_ms=now)
        self._runtime.append(OFFSETS_TOPIC, partition, batch, on_durable)

    def load(self, partition: int) -> Iterator[bytes]:
        """The partition's record sets as the log holds them; the loader walks the batches."""
        return self._runtime.read(OFFSETS_TOPIC, partition)


class GroupService:
    """Creates `__consumer_offsets`, loads the partitions this broker leads and runs the
    coordinator's timers."""

    def __init__(self, runtime: CoordinatorRuntime, config: Mapping[str, Any], clock: Callable[[], int]):
        self._runtime = runtime
        self._config = config
        self._clock = clock
        self.coordinator = GroupCoordinator(config, OffsetsLogStore(runtime, clock),
                                            num_partitions=runtime.partition_count(OFFSETS_TOPIC),
                                            on_deadline=self._arm)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: int | None = None
        self._loaded: set[int] = set()
        self._loads: dict[int, Callable[[], None]] = {}  # partition -> cancels its load

    async def start(self) -> None:
        config = self._config
        partitions = self._runtime.ensure_topic(OFFSETS_TOPIC, self.coordinator.num_partitions, {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            "segment.bytes": config["offsets.topic.segment.bytes"],
        })
        if partitions != config["offsets.topic.num.partitions"]:
            log.warning("%s has %d partitions; offsets.topic.num.partitions=%d applies only to a new topic",
                        OFFSETS_TOPIC, partitions, config["offsets.topic.num.partitions"])
        self._loop = asyncio.get_running_loop()
        self._runtime.watch_leadership(OFFSETS_TOPIC, self._on_elected, self._on_resigned)
        self._fire()

    def _arm(self, deadline_ms: int) -> None:
        """Make sure a timer fires by `deadline_ms` (an earlier armed one already does)."""
        if self._loop is None or (self._armed_for is not None and self._armed_for <= deadline_ms):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline_ms
        self._timer = self._loop.call_later(max(deadline_ms - self._clock(), 0) / 1000, self._fire)

    def _fire(self) -> None:
        self._timer = self._armed_for = None
        try:
            self.coordinator.poll(self._clock())
        except Exception:
            # A bug must not stop every other group's session and rebalance timers for good.
            log.exception("group coordinator timer failed")
        deadline = self.coordinator.next_deadline()
        if deadline is not None:
            self._arm(deadline)

    def _on_elected(self, partition: int, leader_epoch: int) -> None:
        self._loaded.add(partition)
        if self._loop is None:
            self.coordinator.load_partition(partition, self._clock())
            return
        # In steps, through the runtime, so a long partition does not stall the broker; its
        # groups answer COORDINATOR_LOAD_IN_PROGRESS until the load finishes. Its groups are
        # decoded and built in the load's thread; the loop only merges them in.
        loader = self.coordinator.begin_load(partition)

        def loaded() -> None:
            self._loads.pop(partition, None)
            loader.finish(self._clock())

        self._loads[partition] = self._runtime.load(OFFSETS_TOPIC, partition, loader.replay, loaded,
                                                    lambda: loader.prepare(self._clock()))

    def _on_resigned(self, partition: int, leader_epoch: int) -> None:
        if partition in self._loaded:
            self._loaded.discard(partition)
            cancel = self._loads.pop(partition, None)
            if cancel is not None:
                cancel()  # unload_partition drops what it replayed so far
            self.coordinator.unload_partition(partition, self._clock())

    def complete_txn(self, producer_id: int, commit: bool, partitions: Iterable[int]) -> None:
        """The producer's COMMIT/ABORT marker is now in these `__consumer_offsets` partitions."""
        self.coordinator.complete_txn(producer_id=producer_id, partitions=partitions, commit=commit,
                                      now_ms=self._clock())

    def stop(self) -> None:
        """Acknowledge what is already written, then answer waiting members NOT_COORDINATOR so
        they look for the coordinator again once the broker is back."""
        if self._timer is not None:
            self._timer.cancel()
        self._loop = None
        self._runtime.close(OFFSETS_TOPIC)
        for partition in sorted(self._loaded):
            self._on_resigned(partition, -1)
