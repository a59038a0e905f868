"""One partition's log: `<data-dir>/<topic>-<partition>/`, Kafka's UnifiedLog in miniature.

Offsets, in Kafka's words: the log start offset (first readable offset), the log end offset
(LEO, next offset to assign), the high watermark (what consumers may read; on a single node it
follows the LEO, but it is its own attribute so replication can hold it back), the last stable
offset (the HW held back by the earliest open transaction) and the recovery point (everything
below it is fsynced, so crash recovery starts there).

Client batches are validated from their headers, patched in place (offsets, leader epoch,
LogAppendTime) and written as they came: no per-record work on the produce path.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator, NamedTuple

from ..config import TopicConfig
from ..errors import ErrorCode, KafkaError
from ..failpoints import from_environment as failpoints_from_environment
from ..producer_state.manager import ProducerStateManager
from ..producer_state.markers import ControlBatch, read_end_txn_marker
from ..records.batch import (
    MAGIC_OFFSET,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    parse_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from .append_settings import AppendSettings, Validated, validate
from .disk_worker import DiskWorker
from .file_records import FileRecords
from .leader_epoch import EpochEndOffset
from .loader import load_log, replay_batches
from .page_cache import RecentAppends
from .partition_producers import PartitionProducers
from .reads import OffsetAndTimestamp, max_timestamp_offset, offset_for_timestamp, read_batches
from .retention import segments_past_retention
from .rolled_syncs import RolledSyncs
from .segment import LogSegment
from .txn_index import AbortedTxn, aborted_entries

__all__ = ["Log", "AppendResult", "FetchData"]

# A deleted partition's directory, renamed before its removal (Kafka's suffix).
DELETE_SUFFIX = "-delete"
_MAX_RELATIVE_OFFSET = 2**32 - 1  # index entries store offsets relative to the segment base as u32
ORIGINS = ("client", "coordinator", "replication")


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 for CreateTime topics
    log_start_offset: int
    duplicate: bool


# Failpoint (ottla.failpoints): a new leader's epoch checkpoint, written off the path to leading,
# is never written by the disk worker (a crash test kills the broker inside that window).
HOLD_LEADER_EPOCH_WRITE = "leader_epoch.hold_write"
_HOLD_LEADER_EPOCH_WRITE = HOLD_LEADER_EPOCH_WRITE in failpoints_from_environment()


class FetchData(NamedTuple):
    records: bytes | memoryview | FileRecords  # whole batches of the segment file
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # read_committed only: aborted transactions overlapping the returned batches
    aborted_transactions: list[AbortedTxn] | None = None


class Log:
    """A partition's segments and offsets. Not thread-safe: one caller at a time.

    `recovery_point` and `log_start_offset` come from the manager's checkpoints; with
    `clean_shutdown` the recovery point is the exact log end, and nothing on disk is read.
    """

    def __init__(
        self,
        directory: Path,
        config: TopicConfig,
        *,
        recovery_point: int | None = None,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        now_ms: int = 0,
        recent_appends: RecentAppends | None = None,
        disk_worker: DiskWorker | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        # The highest recovery point this log has had, or loaded: the recovery-point checkpoint
        # on disk holds one of those values, so a scan after a crash starts at or below it.
        self._recovery_point_max = recovery_point or 0
        self.config = config
        self._recent_appends = recent_appends
        # Rolls and deletions hand their fsyncs and removals to it (without one: done inline).
        self._disk_worker = disk_worker
        self._rolled = RolledSyncs()  # segments sealed at roll whose fsync is still queued
        self._truncations = 0
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms
        self._segment_created_ms = now_ms
        loaded = load_log(
            self.directory,
            self._new_segment,
            expiration_ms=config.broker["producer.id.expiration.ms"],
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            clean_shutdown=clean_shutdown,
        )
        self._segments, self._bases = loaded.segments, loaded.bases
        self.log_start_offset, self._leo = loaded.log_start_offset, loaded.log_end_offset
        self.recovery_point = loaded.recovery_point
        self.leader_epoch_cache = loaded.leader_epoch_cache
        self._producers = PartitionProducers(self._new_producer_state, lambda: (self.log_start_offset, self._leo),
                                             self._replay, loaded.producer_state)
        for segment in self._segments[:-1]:
            segment.mark_sealed()
        # Until the partition's owner says otherwise (ReplicaManager, or a HW checkpoint).
        self.high_watermark = self.log_end_offset

    @property
    def config(self) -> TopicConfig:
        return self._config

    @config.setter
    def config(self, config: TopicConfig) -> None:
        """AlterConfigs takes effect from the next append (index sizes: from the next segment)."""
        self._config = config
        self._settings = AppendSettings(config)

    # -- segments ---------------------------------------------------------------------------

    def _new_segment(self, base_offset: int) -> LogSegment:
        return LogSegment(
            self.directory,
            base_offset,
            index_max_bytes=self.config["segment.index.bytes"],
            index_interval_bytes=self.config["index.interval.bytes"],
        )

    def replace_segments(self, groups: list[tuple[int, list[int]]]) -> None:
        """The cleaner swapped the files of each group's old segments (`old_bases`, already
        released) for one cleaned segment at `new_base`: point the log at it."""
        for new_base, old_bases in groups:
            i = self._bases.index(old_bases[0])
            cleaned = self._new_segment(new_base)
            cleaned.mark_sealed()
            self._segments[i:i + len(old_bases)] = [cleaned]
            self._bases[i:i + len(old_bases)] = [new_base]

    def _add_segment(self, base_offset: int) -> LogSegment:
        segment = self._new_segment(base_offset)
        segment.create()
        self._segments.append(segment)
        self._bases.append(base_offset)
        return segment

    # -- producer state ------------------------------------------------------------------

    @property
    def producer_state(self) -> ProducerStateManager:
        """Loaded on first use, so a clean start does not read snapshots of idle partitions; a
        load or rebuild still pending is finished first (the server runs them in steps first:
        `rebuild_step`, `server/steps.producer_state_ready`)."""
        return self._producers.state

    @property
    def producer_state_ready(self) -> bool:
        """The producer state is loaded and no rebuild of it is pending."""
        return self._producers.ready

    def rebuild_step(self, *, load: bool = False) -> bool:
        """One step of the producer-state rebuild a truncation left pending, or with `load` of
        its first load; False once the state is ready. The server turns the loop between steps
        (either may replay a segment of batches past the last snapshot); anything using the
        state meanwhile finishes it."""
        return self._producers.step(load=load)

    def finish_rebuild(self) -> None:
        """Before the segments a pending rebuild reads change (the cleaner's swap, retention),
        or the state is used."""
        self._producers.finish()

    def _new_producer_state(self) -> ProducerStateManager:
        return ProducerStateManager(self.directory, expiration_ms=self.config.broker["producer.id.expiration.ms"])

    def _replay(self, from_offset: int) -> Iterator[BatchHeader | ControlBatch]:
        """Every batch from `from_offset` to the log end: what producer state is rebuilt from."""
        return replay_batches(self._segments, self._bases, self._leo, from_offset)

    # -- offsets -------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def last_stable_offset(self) -> int:
        unstable = self.producer_state.first_unstable_offset()
        if unstable is None:
            return self.high_watermark
        return max(self.log_start_offset, min(unstable, self.high_watermark))

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @recovery_point.setter
    def recovery_point(self, offset: int) -> None:
        self._recovery_point = offset
        self._recovery_point_max = max(self._recovery_point_max, offset)

    def start_leader_epoch(self, epoch: int) -> None:
        """This replica leads `epoch` from the log end on (Kafka assigns it before any append).

        With a disk worker the checkpoint is written there, not before leading: a LeaderAndIsr
        of 1,000 new leaders waited seconds for 2,000 fsyncs. Safe because the entry can only
        be missing from the file where a crash's recovery scans: it starts at or above every
        recovery point this log has had (the checkpointed one among them), recovery re-derives
        it from the batches that carry the epoch (`LeaderEpochCache.recover_epochs`), and the
        recovery point never passes it before it is written (`roll`, `flush`, `close`). Where
        that does not hold -- the log end below an earlier recovery point after a truncation,
        a load's cut still unwritten, an epoch not newer than the latest -- it is written now.
        """
        cache, start = self.leader_epoch_cache, self._leo
        worker = self._disk_worker
        latest = cache.latest_epoch
        if (worker is None or start < self._recovery_point_max or cache.unwritten
                or (latest is not None and epoch <= latest)):
            cache.assign(epoch, start)
        elif cache.assign(epoch, start, write=False) and not _HOLD_LEADER_EPOCH_WRITE:
            worker.submit(f"leader epoch checkpoint of {self.directory.name}", cache.write_pending)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """OffsetsForLeaderEpoch: `(epoch, end offset)` from the leader epoch cache (KIP-279)."""
        return self.leader_epoch_cache.end_offset_for(epoch, self._leo)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    # -- append --------------------------------------------------------------------------

    def validate(self, records, now_ms: int, inline: int | None = None) -> Validated:
        """A produced record set checked as `append` checks it, appending nothing; with `inline`,
        ValidateElsewhere for a batch that is more work than that (`append_settings.validate`)."""
        return validate(records, now_ms, self._settings, self.directory.name, inline)

    def append(
        self, records: bytes | bytearray | Validated, *, now_ms: int, origin: str = "client", leader_epoch: int = 0
    ) -> AppendResult:
        """Validate, assign offsets, write. Raises KafkaError with the code the producer must see.

        origin "client": a produce request (exactly one batch, Kafka's LogValidator rules), or
        what `validate` made of one;
        "coordinator": batches the broker writes itself (transaction markers, internal topics);
        "replication": batches that already carry their offsets, which must continue the log.
        """
        if origin not in ORIGINS:
            raise ValueError(f"unknown append origin {origin!r}")
        buf = records
        settings = self._settings
        if origin == "client":  # records may come checked already (`validate`)
            buf, headers = validate(records, now_ms, settings, self.directory.name)[:2]
        else:
            # Kafka checks max.message.bytes on every leader append, the coordinators' included (an
            # OffsetCommit too large for one batch is INVALID_COMMIT_OFFSET_SIZE); not on replication.
            headers = parse_batches(buf, max_batch_bytes=settings.max_message_bytes if origin != "replication" else None)

        log_append_time = now_ms if settings.log_append_time else -1
        if origin != "replication" and log_append_time < 0 and len(headers) == 1:
            # The usual produce: only the first bytes of the batch change (base offset and
            # leader epoch, outside the CRC), so they are patched in a small copy and the rest
            # is written straight from the request's buffer.
            head = bytearray(buf[:MAGIC_OFFSET])
            parts = (head, memoryview(buf)[MAGIC_OFFSET:])
        else:
            buf = head = buf if isinstance(buf, bytearray) else bytearray(buf)
            parts = (buf,)
        assigned = []
        next_offset = self._leo
        for header in headers:
            if origin == "replication":
                if header.base_offset < next_offset:
                    raise KafkaError(
                        ErrorCode.invalid_record,
                        f"replicated batch at {header.base_offset} is below the log end {next_offset}",
                    )
            else:
                set_base_offset(head, header.position, next_offset)
                set_partition_leader_epoch(head, header.position, leader_epoch)
                header = header._replace(base_offset=next_offset, partition_leader_epoch=leader_epoch)
                if log_append_time >= 0:
                    set_log_append_time(head, header.position, header.size, log_append_time)
                    header = header._replace(
                        max_timestamp=log_append_time, attributes=header.attributes | TIMESTAMP_TYPE_BIT
                    )
            assigned.append(header)
            next_offset = header.last_offset + 1
        first_offset = assigned[0].base_offset
        last_offset = assigned[-1].last_offset

        state = self.producer_state
        self._maybe_roll(len(buf), max(h.max_timestamp for h in assigned), last_offset, now_ms)
        plan = state.validate(
            [ControlBatch(h, read_end_txn_marker(buf, h)) if h.is_control else h for h in assigned],
            now_ms,
            origin,
        )
        if plan.duplicate is not None:
            dup = plan.duplicate
            return AppendResult(
                dup.first_offset,
                dup.last_offset,
                dup.timestamp if log_append_time >= 0 else -1,
                self.log_start_offset,
                True,
            )
        for header in assigned:  # before the bytes, as Kafka: recovery cuts the cache back to the log
            self.leader_epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
        segment = self.active_segment
        segment.append(parts, assigned)
        if self._recent_appends is not None:
            self._recent_appends.appended(segment)
        self._leo = next_offset
        completed = state.apply(plan)
        if completed:
            for txn in aborted_entries(completed, state.first_unstable_offset()):
                segment.txn_index.append(txn)

        self._unflushed_messages += sum(h.records_count for h in assigned)
        if (
            self._unflushed_messages >= settings.flush_messages
            or now_ms - self._last_flush_ms >= settings.flush_ms
        ):
            self.flush(now_ms)
        return AppendResult(first_offset, last_offset, log_append_time, self.log_start_offset, False)

    def _maybe_roll(self, size: int, max_timestamp: int, last_offset: int, now_ms: int) -> None:
        """Roll before an append that would overflow segment.bytes, outlive segment.ms, fill an
        index, or need relative offsets an index cannot hold (Kafka's shouldRoll)."""
        segment = self.active_segment
        if segment.size == 0:
            self._segment_created_ms = now_ms
            return
        first_timestamp = segment.first_batch_timestamp()
        if first_timestamp is not None and first_timestamp >= 0 and max_timestamp >= 0:
            age = max_timestamp - first_timestamp
        else:
            age = now_ms - self._segment_created_ms
        if (
            segment.size + size > self._settings.segment_bytes
            or age > self._settings.segment_ms
            or segment.indexes_full()
            or last_offset - segment.base_offset > _MAX_RELATIVE_OFFSET
        ):
            self.roll(now_ms)

    def roll(self, now_ms: int) -> LogSegment:
        """Start a new active segment at the log end; the old one is sealed and fsynced, with
        the producer snapshot. With a disk worker the fsyncs run there and the recovery point
        moves once they are done, as Kafka's roll schedules its flush. Not at or below a
        recovery point the checkpoint may still hold (after a truncation below it): an unclean
        load would scan from above this segment and trust it, so it is made durable now."""
        worker = self._disk_worker
        inline = worker is None or self._leo <= self._recovery_point_max
        if inline:
            self.leader_epoch_cache.write_pending()
            self._rolled.sync_now()
        unsynced = self.active_segment.seal(sync=inline)
        segment = self._add_segment(self._leo)
        self._segment_created_ms = now_ms
        finish_snapshot = self.producer_state.take_snapshot(self._leo, sync=inline)
        self._unflushed_messages = 0
        if inline:
            self.recovery_point = self._leo
        else:
            self._sync_later(worker, unsynced, finish_snapshot)
        return segment

    def _sync_later(self, worker: DiskWorker, unsynced: list[tuple[int, Path]], finish_snapshot) -> None:
        end, truncations = self._leo, self._truncations

        def synced() -> None:
            if truncations == self._truncations:  # else what is below `end` changed
                self.recovery_point = max(self.recovery_point, min(end, self._leo))
        # The epoch checkpoint first: before the recovery point passes a new leader's epoch start.
        self._rolled.submit(worker, f"fsync of {self.directory.name} rolled at offset {end}", unsynced,
                            first=self.leader_epoch_cache.write_pending, last=finish_snapshot, synced=synced)

    # -- read ----------------------------------------------------------------------------

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        max_offset: int,
        min_one_batch: bool = True,
        with_aborted: bool = False,
        lazy: bool = False,
    ) -> FetchData:
        """Whole batches from the one holding `fetch_offset`, none reaching `max_offset` (the HW
        or LSO, exclusive); at least one batch even over `max_bytes` when `min_one_batch`.
        `with_aborted` (read_committed) also lists the aborted transactions the data overlaps.
        `lazy`: large results stay in the file until sent (see file_records.py).

        Like Kafka, one fetch reads from one segment; the client asks again for the rest.
        """
        if fetch_offset < self.log_start_offset or fetch_offset > self._leo:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"offset {fetch_offset} is outside [{self.log_start_offset}, {self._leo}]",
            )
        records, aborted = read_batches(self._segments, self._bases, self._leo, fetch_offset, max_bytes,
                                        max_offset, min_one_batch, with_aborted, lazy)
        return FetchData(records, self.high_watermark, self.last_stable_offset, self.log_start_offset, aborted)

    def offset_for_timestamp(self, timestamp: int) -> OffsetAndTimestamp | None:
        """ListOffsets by time: the first record with a timestamp >= `timestamp`, or None."""
        return offset_for_timestamp(self._segments, self.log_start_offset, timestamp)

    def max_timestamp_offset(self) -> OffsetAndTimestamp | None:
        """ListOffsets MAX_TIMESTAMP (-3): the first record carrying the largest timestamp; None if empty."""
        return max_timestamp_offset(self._segments)

    # -- truncation, flush, lifecycle ----------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: raise the log start offset to `offset` (at most the HW) and drop the
        segments wholly below it. Returns the new log start offset."""
        if offset > self.high_watermark or offset < 0:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"cannot delete records before {offset}: high watermark is {self.high_watermark}",
            )
        if offset > self.log_start_offset:
            self._advance_log_start(offset)
        return self.log_start_offset

    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest segments past retention.ms or beyond retention.bytes
        (`segments_past_retention`). Returns how many segments went."""
        deleted = segments_past_retention(self._segments, self._bases, self.high_watermark, self.config, now_ms)
        if deleted:
            self._advance_log_start(self._bases[deleted])
        return deleted

    def _advance_log_start(self, offset: int) -> None:
        """A state not loaded yet stays so (retention of a partition idle since the start would
        replay in one piece what its first use loads in steps): that load drops the snapshots
        below the new start and forgets the producers whose batches all lie below it, as a move
        does. (With the snapshots lost, a transaction all of whose batches went is forgotten
        rather than holding the LSO at the log start: its records are gone either way.)"""
        self.finish_rebuild()
        self.log_start_offset = offset
        self.leader_epoch_cache.truncate_from_start(offset)
        while len(self._segments) > 1 and self._bases[1] <= offset:
            self._segments.pop(0).delete()
            self._bases.pop(0)
        state = self._producers.created
        if state is not None:
            state.on_log_start_offset(offset)

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark, kept within [log start, log end]; the partition decides it
        (leader: the smallest LEO of the ISR), never an append."""
        self.high_watermark = min(max(offset, self.log_start_offset), self._leo)
        return self.high_watermark

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or after `offset` (whole batches: the log end becomes the start of
        the batch holding `offset`), e.g. when a follower diverged or a write must be undone.
        With nothing at or after `offset`, only the leader epoch cache is cut at the log end:
        a former leader's epoch that starts there but holds no batch (assigned on election,
        never written in) is not the new leader's, as Kafka's truncateTo does (KAFKA-7415)."""
        if offset >= self._leo:
            self.leader_epoch_cache.truncate_from_end(self._leo)
            return
        if offset <= self.log_start_offset:
            self._truncate_fully(offset)
        else:
            new_end = None
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                new_end = self._segments[-1].base_offset
                self._segments.pop().delete()
                self._bases.pop()
            removed_from = self.active_segment.truncate_to(offset)
            if removed_from is not None:
                self._leo = removed_from
            else:  # the cut falls in a gap between batches, or exactly at a segment boundary
                self._leo = new_end if new_end is not None else offset
            if self._leo < self.log_start_offset:  # a batch straddling the log start went whole
                self._truncate_fully(self.log_start_offset)
        self.leader_epoch_cache.truncate_from_end(self._leo)
        self.high_watermark = min(self.high_watermark, self._leo)
        self.recovery_point = min(self.recovery_point, self._leo)
        self._truncations += 1
        self._producers.reload()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and restart it at `offset`: a follower behind its leader's log start."""
        self._truncate_fully(offset)
        self.high_watermark = self.recovery_point = offset
        self._truncations += 1
        self._producers.reload()

    def _truncate_fully(self, offset: int) -> None:
        for segment in self._segments:
            segment.delete()
        self._segments, self._bases = [], []
        self._add_segment(offset)
        self.leader_epoch_cache.clear()
        self.log_start_offset = offset
        self._leo = offset

    def flush(self, now_ms: int | None = None) -> None:
        """fsync the active segment (and segments rolled whose fsync is still queued); the
        recovery point moves to the log end."""
        self.leader_epoch_cache.write_pending()
        self._rolled.sync_now()
        self.active_segment.flush()
        self.recovery_point = self._leo
        self._unflushed_messages = 0
        if now_ms is not None:
            self._last_flush_ms = now_ms

    def duplicate_data_fds(self) -> list[int]:
        """Duplicates of the descriptors whose fdatasync off the event loop makes every batch
        appended so far durable: the active .log's (if it has a file open yet) and those of
        segments rolled whose fsync is still queued in the disk worker.

        For acknowledging internal-topic writes (offset commits, transaction state), where a
        full `flush` (the .log, then msync and fsync of both indexes) was most of the cost of
        a commit. The recovery point does not move, so after a crash these batches are
        rescanned and their index entries rebuilt; batches in an older segment were fsynced
        with everything else when it rolled. The caller closes the duplicates.
        """
        fds = self._rolled.duplicate_fds()
        active = self.active_segment.duplicate_fd()
        return fds if active is None else fds + [active]

    def flush_if_due(self, now_ms: int) -> None:
        """flush.ms for a partition that stopped receiving appends; called by the manager's tick."""
        if self._leo > self.recovery_point and now_ms - self._last_flush_ms >= self._settings.flush_ms:
            self.flush(now_ms)

    def remove_expired_producers(self, now_ms: int) -> None:
        """producer.id.expiration.ms; a state not loaded yet, or being rebuilt in steps, is expired
        by a later call (not loaded in one piece here)."""
        if self._producers.ready:
            self.producer_state.remove_expired(now_ms)

    def close(self) -> None:
        """Flush, trim the indexes, snapshot producer state: the next start needs no recovery.
        Closing the active segment fsyncs it and its indexes (a `flush` first did it twice)."""
        self.finish_rebuild()
        self.leader_epoch_cache.write_pending()
        self._rolled.sync_now()
        for segment in self._segments:
            segment.close()
        self.recovery_point = self._leo
        state = self._producers.created
        if state is not None:
            state.take_snapshot(self._leo)

    def delete(self, *, remove: bool = True) -> Path:
        """Remove the partition's directory and everything in it. With a disk worker the
        directory is renamed `<name>.<id>-delete` (as Kafka does) and removed there; a start
        removes what a crash left. `remove=False` leaves the renamed directory, returned, to the
        caller, who removes many in one job (`LogManager.delete_topic`)."""
        directory = self.directory
        self._producers.drop_pending()
        self.leader_epoch_cache.close()
        if self._disk_worker is not None:
            directory = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
            try:
                os.replace(self.directory, directory)
            except FileNotFoundError:  # already gone: as rmtree(ignore_errors=True) would take it
                pass
        for segment in self._segments:  # with a disk worker their files went with the directory
            segment.delete(unlink=self._disk_worker is None)
        self._segments, self._bases = [], []
        if self._disk_worker is None:
            shutil.rmtree(directory, ignore_errors=True)
        elif remove:
            self._disk_worker.submit(f"removal of {directory.name}",
                                     lambda: shutil.rmtree(directory, ignore_errors=True))
        return directory
