"""Per-partition state of idempotent and transactional producers (Kafka's ProducerStateManager).

For every producer id the partition remembers its epoch, its last few batches (to answer
retries with the original offsets instead of appending twice), its ongoing transaction and
the epoch of the coordinator that last ended one. `ottla.log.Log` drives it:

    plan = state.validate(batches, now_ms, origin)   # raises KafkaError; changes nothing
    if plan.duplicate: answer with the original offsets, write nothing
    else: write the bytes, then completed = state.apply(plan)

Validation works on copies, so a rejected request leaves no trace, and `apply` refuses a
plan computed against state that has moved on (two appends validated before either was
applied would otherwise both pass the sequence check).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from ..errors import ErrorCode, KafkaError
from ..records.batch import BatchHeader
from . import snapshot
from ._files import fsync_dir
from .entry import NO_PRODUCER_EPOCH, BatchMetadata, ProducerEntry, in_sequence
from .markers import ControlBatch, EndTxnMarker

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
MAX_BATCHES = 5  # Kafka's NumBatchesToRetain: why idempotent clients keep <= 5 requests in flight
SNAPSHOTS_TO_KEEP = 3
RELOAD_STEP_BATCHES = 1_000  # replayed between two turns of the event loop (~5-10 ms of CPU)

ORIGINS = frozenset({"client", "coordinator", "replication", "recovery"})
# Batches already in some log: we record what they did instead of judging them.
_REPLAYED = frozenset({"replication", "recovery"})

Batch = BatchHeader | ControlBatch


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker at `last_offset`; the log indexes aborted ones."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class ActiveProducer(NamedTuple):
    """One row of DescribeProducers (KIP-664); -1 where there is no value."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True)
class AppendPlan:
    """What an append will do to producer state, computed by `validate`, installed by `apply`."""

    duplicate: BatchMetadata | None
    entries: Mapping[int, ProducerEntry]
    completed_txns: tuple[CompletedTxn, ...]
    end_offset: int | None  # one past the last offset of the batches
    base_version: int = field(repr=False)


def _split(item: Batch) -> tuple[BatchHeader, EndTxnMarker | None]:
    if isinstance(item, ControlBatch):
        return item.header, item.marker
    return item, None


class ProducerStateManager:
    """Producer ids of one partition, their sequence windows, transactions and snapshots."""

    def __init__(
        self,
        log_dir: Path,
        *,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        max_batches: int = MAX_BATCHES,
        snapshots_to_keep: int = SNAPSHOTS_TO_KEEP,
    ):
        if not 1 <= max_batches <= snapshot.MAX_BATCHES_PER_ENTRY:
            raise ValueError(f"max_batches must be in [1, {snapshot.MAX_BATCHES_PER_ENTRY}]")
        if snapshots_to_keep < 1:
            raise ValueError("snapshots_to_keep must be at least 1")
        self.log_dir = Path(log_dir)
        self.expiration_ms = expiration_ms
        self.max_batches = max_batches
        self.snapshots_to_keep = snapshots_to_keep
        self._producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._map_end_offset = 0
        self._version = 0
        self._changes = 0  # producers installed or removed, ever
        self._snapshotted: tuple[int, int] | None = None  # (offset, changes) a snapshot file holds
        snapshot.remove_temp_files(self.log_dir)
        self._snapshots = snapshot.list_snapshots(self.log_dir)

    # -- appends ------------------------------------------------------------------------

    def validate(self, batches: Sequence[Batch], now_ms: int, origin: str = "client") -> AppendPlan:
        """Check `batches` (already carrying their final offsets) and plan their effect.

        Batches of one producer are checked in order, each against the state the previous
        ones leave. Control batches must come as `ControlBatch`. Raises KafkaError:
        OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH,
        INVALID_TXN_STATE, TRANSACTION_COORDINATOR_FENCED, INVALID_RECORD.
        """
        if origin not in ORIGINS:
            raise ValueError(f"unknown append origin {origin!r}")
        updated: dict[int, ProducerEntry] = {}
        completed: list[CompletedTxn] = []
        end_offset = None
        for item in batches:
            header, marker = _split(item)
            end_offset = header.last_offset + 1
            if not header.has_producer_id:
                continue
            pid = header.producer_id
            if origin == "client":
                duplicate = self._find_duplicate(header)
                if duplicate is not None:
                    return AppendPlan(duplicate, {}, (), None, self._version)
            current = updated[pid] if pid in updated else self._producers.get(pid, ProducerEntry(pid))
            # Recovery has no "now", and a follower's is not its leader's: the batch's own
            # time is the best they know, and the same on every replica (Kafka uses it always).
            timestamp = header.max_timestamp if origin in _REPLAYED else now_ms
            if header.is_control:
                if origin == "client":
                    raise KafkaError(ErrorCode.invalid_record, "clients may not write control batches")
                if marker is None:
                    raise ValueError(f"control batch at offset {header.base_offset} must come as a ControlBatch")
                entry, txn = self._end_txn(current, header, marker, origin, timestamp)
                if txn is not None:
                    completed.append(txn)
            else:
                entry = self._append_data(current, header, origin, timestamp)
            updated[pid] = entry
        return AppendPlan(None, updated, tuple(completed), end_offset, self._version)

    def apply(self, plan: AppendPlan) -> list[CompletedTxn]:
        """Install a plan once its batches are in the log; returns the transactions it ended."""
        if plan.duplicate is not None:
            raise ValueError("a duplicate must not be appended, so its plan cannot be applied")
        if plan.base_version != self._version:
            raise RuntimeError("stale plan: producer state changed between validate() and apply()")
        for entry in plan.entries.values():
            self._install(entry)
        if plan.end_offset is not None:
            self._map_end_offset = plan.end_offset
        self._version += 1
        return list(plan.completed_txns)

    def _find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        entry = self._producers.get(header.producer_id)
        if entry is None:
            return None
        return entry.find_batch(header.producer_epoch, header.base_sequence, header.last_sequence)

    def _check_epoch(self, current: ProducerEntry, epoch: int, offset: int, origin: str) -> None:
        # Since Kafka 2.7 (KIP-588) a stale epoch on produce is INVALID_PRODUCER_EPOCH, which a
        # transactional client can abort on; PRODUCER_FENCED is the coordinator's answer.
        if epoch < current.epoch and origin not in _REPLAYED:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"producer {current.producer_id} at offset {offset}: epoch {epoch} is older than {current.epoch}",
            )

    def _check_sequence(self, current: ProducerEntry, header: BatchHeader) -> None:
        pid, epoch, first_seq = header.producer_id, header.producer_epoch, header.base_sequence
        if epoch != current.epoch:
            if first_seq == 0:
                return
            if current.epoch == NO_PRODUCER_EPOCH:
                # Kafka 0.11-2.4 behaviour; see the package docs for why we keep it.
                raise KafkaError(
                    ErrorCode.unknown_producer_id,
                    f"no state for producer {pid} and its batch starts at sequence {first_seq}, not 0",
                )
            raise KafkaError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid}: new epoch {epoch} must start at sequence 0, got {first_seq}",
            )
        if not in_sequence(current.last_seq, first_seq):
            raise KafkaError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid}: sequence {first_seq} does not follow {current.last_seq}",
            )

    def _append_data(self, current: ProducerEntry, header: BatchHeader, origin: str, timestamp: int) -> ProducerEntry:
        epoch = header.producer_epoch
        self._check_epoch(current, epoch, header.base_offset, origin)
        if origin == "client":
            self._check_sequence(current, header)
        txn_first = current.txn_first_offset
        if txn_first is None and header.is_transactional:
            txn_first = header.base_offset
        elif txn_first is not None and not header.is_transactional and origin not in _REPLAYED:
            raise KafkaError(
                ErrorCode.invalid_txn_state,
                f"producer {current.producer_id} wrote a non-transactional batch inside its open transaction",
            )
        meta = BatchMetadata(
            header.base_sequence, header.last_sequence, header.base_offset, header.last_offset, header.max_timestamp
        )
        kept = current.batches if epoch == current.epoch else ()
        # Built directly, not with dataclasses.replace, which inspects the fields on every call:
        # this runs once per produced batch.
        return ProducerEntry(current.producer_id, epoch, (kept + (meta,))[-self.max_batches :], timestamp,
                             header.last_offset, current.coordinator_epoch, txn_first)

    def _end_txn(
        self, current: ProducerEntry, header: BatchHeader, marker: EndTxnMarker, origin: str, timestamp: int
    ) -> tuple[ProducerEntry, CompletedTxn | None]:
        epoch = header.producer_epoch
        self._check_epoch(current, epoch, header.base_offset, origin)
        if marker.coordinator_epoch < current.coordinator_epoch and origin not in _REPLAYED:
            raise KafkaError(
                ErrorCode.transaction_coordinator_fenced,
                f"marker for producer {current.producer_id} from coordinator epoch {marker.coordinator_epoch}, "
                f"which is older than {current.coordinator_epoch}",
            )
        txn = None
        if current.txn_first_offset is not None:
            txn = CompletedTxn(current.producer_id, current.txn_first_offset, header.base_offset, not marker.commit)
        entry = replace(
            current,
            epoch=epoch,
            batches=current.batches if epoch == current.epoch else (),
            last_timestamp=timestamp,
            last_offset=header.last_offset,
            coordinator_epoch=marker.coordinator_epoch,
            txn_first_offset=None,
        )
        return entry, txn

    def _install(self, entry: ProducerEntry) -> None:
        self._changes += 1
        self._producers[entry.producer_id] = entry
        if entry.txn_first_offset is None:
            self._ongoing.pop(entry.producer_id, None)
        else:
            self._ongoing[entry.producer_id] = entry.txn_first_offset

    def _remove(self, pids: Iterable[int]) -> int:
        pids = list(pids)
        self._changes += len(pids)
        for pid in pids:
            del self._producers[pid]
            self._ongoing.pop(pid, None)
        return len(pids)

    # -- queries -------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction; the LSO cannot pass it."""
        return min(self._ongoing.values(), default=None)

    def active_producers(self) -> list[ActiveProducer]:
        """DescribeProducers' view of this partition, by producer id."""
        return [
            ActiveProducer(
                e.producer_id,
                e.epoch,
                e.last_seq,
                e.last_timestamp,
                e.coordinator_epoch,
                -1 if e.txn_first_offset is None else e.txn_first_offset,
            )
            for e in sorted(self._producers.values(), key=lambda e: e.producer_id)
        ]

    def entry(self, producer_id: int) -> ProducerEntry | None:
        """The live state of one producer (Kafka's lastEntry)."""
        return self._producers.get(producer_id)

    def last_batch_offsets(self) -> dict[int, int]:
        """Per producer, the last offset of its latest data batch (of its latest marker if it
        wrote no data this epoch): the log cleaner keeps that batch, emptied if need be, so the
        producer's sequence survives compaction (Kafka's lastRecordsOfActiveProducers)."""
        return {pid: e.batches[-1].last_offset if e.batches else e.last_offset for pid, e in self._producers.items()}

    def skip_to(self, offset: int) -> None:
        """The batches below `offset` not applied carry no producer id: recovery's fast path
        skips them, as they change nothing here but the end offset."""
        self._map_end_offset = max(self._map_end_offset, offset)

    @property
    def map_end_offset(self) -> int:
        """The state reflects every batch below this offset."""
        return self._map_end_offset

    @property
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files on disk, ascending."""
        return list(self._snapshots)

    # -- expiry --------------------------------------------------------------------------

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle for `expiration_ms`, unless a transaction of theirs is open."""
        return self._remove(
            pid
            for pid, e in self._producers.items()
            if e.txn_first_offset is None and now_ms - e.last_timestamp >= self.expiration_ms
        )

    def on_log_start_offset(self, offset: int) -> int:
        """Retention moved the log start: forget producers whose last batch is gone.

        Producers with an open transaction stay, so the LSO keeps holding until the
        coordinator's marker arrives (the log clamps the LSO to its start offset).
        Snapshots below the new start are deleted too: replay could not begin there.
        """
        removed = self._remove(
            pid for pid, e in self._producers.items() if e.txn_first_offset is None and e.last_offset < offset
        )
        self._delete_snapshots(o for o in self._snapshots if o < offset)
        self._map_end_offset = max(self._map_end_offset, offset)
        return removed

    # -- snapshots and reload ------------------------------------------------------------

    def take_snapshot(self, offset: int, *, sync: bool = True) -> Callable[[], None] | None:
        """Durably record the state as of `offset`, which must cover everything applied.

        Called at segment roll (offset = the new segment's base) and at clean shutdown
        (offset = log end). Keeps the newest `snapshots_to_keep` files. With `sync=False`
        the file is written but the fsyncs are left to the returned job, to run off the
        event loop (Kafka flushes its roll-time snapshot asynchronously too).
        """
        if offset < self._map_end_offset:
            raise ValueError(f"snapshot offset {offset} is below the state's end offset {self._map_end_offset}")
        if self._snapshotted == (offset, self._changes) and offset in self._snapshots:
            # Kafka's takeSnapshot too: nothing new since the snapshot this state was loaded
            # from or last wrote (a clean restart of an idle partition rewrote it, with 2 fsyncs).
            return None if sync else (lambda: None)
        finish = snapshot.write_snapshot(self.log_dir, offset, self._producers.values(), sync=sync)
        if offset not in self._snapshots:
            self._snapshots.append(offset)
            self._snapshots.sort()
        self._map_end_offset = offset
        self._snapshotted = (offset, self._changes)
        deleted = self._delete_snapshots(self._snapshots[: -self.snapshots_to_keep], sync=sync)
        if sync:
            return None

        def finish_all() -> None:
            finish()
            if deleted:
                fsync_dir(self.log_dir)
        return finish_all

    def truncate_and_reload(
        self,
        log_start_offset: int,
        log_end_offset: int,
        replay: Callable[[int], Iterable[Batch]],
        *,
        keep_above: bool = False,
    ) -> list[CompletedTxn]:
        """Rebuild the state for a log holding [log_start_offset, log_end_offset).

        Used for recovery at startup and after any truncation. Snapshots outside the range
        are deleted; the newest readable one is loaded (corrupt ones are deleted and skipped)
        and `replay(offset)` must then yield the log's batches from that offset on, control
        batches as `ControlBatch`; batches wholly below it or at/after the end are skipped.
        Returns the transactions the replayed markers ended, for rebuilding the txn index.

        `keep_above`: snapshots above `log_end_offset` stay on disk, unloaded. Recovery
        rebuilds the state only up to where its scan starts, and deletes those above the log
        end the scan finds (`delete_snapshots_above`): deleting them first cost every
        partition an unlink and a directory fsync, for a snapshot still valid after the scan.
        """
        steps = self.reload_in_steps(log_start_offset, log_end_offset, replay, keep_above=keep_above)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def reload_in_steps(
        self,
        log_start_offset: int,
        log_end_offset: int,
        replay: Callable[[int], Iterable[Batch]],
        *,
        keep_above: bool = False,
    ) -> Generator[None, None, list[CompletedTxn]]:
        """`truncate_and_reload` pausing after every RELOAD_STEP_BATCHES replayed batches, so
        that an event loop can serve others between steps: snapshots are only taken at roll and
        clean shutdown, so a truncation may replay up to a segment of batches. The state is
        half-built until the generator ends: its owner runs it to the end before anything else
        uses the state, and keeps the log it replays unchanged meanwhile (`Log.rebuild_step`)."""
        self._delete_snapshots(o for o in self._snapshots
                               if (o > log_end_offset and not keep_above) or o < log_start_offset)
        self._producers.clear()
        self._ongoing.clear()
        self._version += 1
        start = log_start_offset
        for offset in reversed([o for o in self._snapshots if o <= log_end_offset]):
            try:
                entries = snapshot.read_snapshot(self.log_dir, offset)
            except snapshot.CorruptSnapshotError as exc:
                log.warning("Deleting unusable producer snapshot at offset %d in %s: %s", offset, self.log_dir, exc)
                self._delete_snapshots([offset])
                continue
            for entry in entries:
                self._install(replace(entry, batches=entry.batches[-self.max_batches :]))
            start = offset
            self._snapshotted = (offset, self._changes)
            break
        self._map_end_offset = start
        completed: list[CompletedTxn] = []
        replayed = 0
        for item in replay(start):
            header, _ = _split(item)
            if header.last_offset < start:
                continue
            if header.base_offset >= log_end_offset:
                break
            completed.extend(self.apply(self.validate([item], header.max_timestamp, origin="recovery")))
            replayed += 1
            if replayed % RELOAD_STEP_BATCHES == 0:
                yield
        self.on_log_start_offset(log_start_offset)
        self._map_end_offset = log_end_offset
        return completed

    def delete_snapshots_above(self, offset: int) -> None:
        """Recovery found the log end at `offset`: snapshots past it describe lost batches."""
        self._delete_snapshots([o for o in self._snapshots if o > offset])

    def _delete_snapshots(self, offsets: Iterable[int], sync: bool = True) -> bool:
        # The directory fsync keeps a deleted snapshot from reappearing after power loss,
        # where it could describe a log that has since been truncated and rewritten.
        offsets = list(offsets)
        for offset in offsets:
            snapshot.snapshot_path(self.log_dir, offset).unlink(missing_ok=True)
            self._snapshots.remove(offset)
        if offsets and sync:
            fsync_dir(self.log_dir)
        return bool(offsets)
