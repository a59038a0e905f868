"""Opening a partition's log: find its segments, recover them after an unclean shutdown, fit
the leader epoch cache to what survived (Kafka's LogLoader)."""

from __future__ import annotations

import bisect
import logging
import os
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from ..producer_state.manager import ProducerStateManager
from ..producer_state.markers import ControlBatch, read_end_txn_marker
from ..records.batch import BatchHeader
from .cleaner.swap import recover_swaps
from .leader_epoch import LeaderEpochCache, fit_to_log
from .segment import LogSegment
from .txn_index import CorruptIndexError, aborted_entries

__all__ = ["LoadedLog", "load_log", "replay_batches"]

log = logging.getLogger(__name__)


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    bases: list[int]
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    leader_epoch_cache: LeaderEpochCache
    producer_state: ProducerStateManager | None  # rebuilt by recovery; else loaded on first use


def load_log(
    directory: Path,
    new_segment: Callable[[int], LogSegment],
    *,
    expiration_ms: int,
    recovery_point: int | None,
    log_start_offset: int,
    clean_shutdown: bool,
) -> LoadedLog:
    """`recovery_point` and `log_start_offset` come from the manager's checkpoints; with
    `clean_shutdown` the recovery point is the exact log end, and nothing on disk is read.
    The recovery point returned is never above what is on disk."""
    bases = []
    for name in recover_swaps(directory):
        stem, _, suffix = name.partition(".")
        if suffix == "log" and stem.isdigit():
            bases.append(int(stem))
    bases.sort()
    segments = [new_segment(b) for b in bases]
    cache, cache_usable = LeaderEpochCache.load(directory)
    state = None
    epoch_starts: list[tuple[int, int]] = []
    if not bases:
        segment = new_segment(log_start_offset)
        segment.create()
        segments.append(segment)
        bases.append(log_start_offset)
        end = recovery_point = log_start_offset
    else:
        log_start_offset = max(log_start_offset, bases[0])
        if clean_shutdown and recovery_point is not None and recovery_point >= bases[-1]:
            # Clean shutdown flushed everything and checkpointed the exact log end.
            end = recovery_point
        else:
            end, state = _recover(directory, segments, bases, recovery_point or 0, log_start_offset, expiration_ms,
                                  epoch_starts)
            # Not the log end: the active segment's recovered bytes may be in the page cache only
            # (a kill -9), and a checkpoint must not call them durable. Every segment below it is
            # (below the old recovery point, or fsynced by the scan's seal).
            recovery_point = max(min(recovery_point or 0, end), bases[-1])
    fit_to_log(cache, cache_usable, segments, log_start_offset, end, epoch_starts)
    return LoadedLog(segments, bases, log_start_offset, end, recovery_point, cache, state)


def _recover(
    directory: Path,
    segments: list[LogSegment],
    bases: list[int],
    recovery_point: int,
    log_start_offset: int,
    expiration_ms: int,
    epoch_starts: list[tuple[int, int]],
) -> tuple[int, ProducerStateManager]:
    """Re-validate everything from the segment holding the recovery point and cut the log
    at the first torn or corrupt batch (Kafka's LogLoader after an unclean shutdown).
    Drops unusable segments from `segments` and `bases`; returns the log end and the
    producer state; `epoch_starts` gets where the scanned batches' leader epochs first rise.

    Producer state is reloaded up to the first scanned segment and then fed every batch
    the scan accepts, which also rebuilds the scanned segments' transaction indexes.
    Older segments were fsynced, so only damaged offset/time indexes are rebuilt there; a
    damaged transaction index needs producer state, so the scan starts at its segment.
    """
    first = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    for i, segment in enumerate(segments[:first]):
        try:
            segment.txn_index.sanity_check()
        except CorruptIndexError:
            first = i
            break
    for segment in segments[:first]:
        if not segment.indexes_sane():
            log.info("rebuilding indexes of %s", segment.log_path)
            segment.rebuild_indexes()

    scan_from = segments[first].base_offset
    state = ProducerStateManager(directory, expiration_ms=expiration_ms)
    state.truncate_and_reload(log_start_offset, scan_from,
                              lambda offset: replay_batches(segments, bases, scan_from, offset), keep_above=True)

    scanned_bytes = truncated_bytes = 0
    next_offset = scan_from
    keep = len(segments)
    for i in range(first, len(segments)):
        segment = segments[i]
        if segment.base_offset < next_offset:  # overlaps what precedes it: unusable
            keep = i
            break
        segment.txn_index.reset()
        next_offset, truncated = segment.recover(_replay_into(state, segment), epoch_starts)
        scanned_bytes += segment.size + truncated
        truncated_bytes += truncated
        if truncated:  # nothing after a torn or corrupt batch can be trusted
            keep = i + 1
            break
    state.skip_to(next_offset)
    state.delete_snapshots_above(next_offset)
    for segment in segments[keep:]:
        truncated_bytes += segment.size
        segment.delete()
    del segments[keep:]
    del bases[keep:]
    for segment in segments[first:-1]:
        segment.seal()
    if scanned_bytes or truncated_bytes:
        log.info(
            "recovered log %s: scanned %d bytes in %d segments, truncated %d bytes, log end offset %d",
            directory.name,
            scanned_bytes,
            keep - first,
            truncated_bytes,
            next_offset,
            extra={
                "partition_dir": directory.name,
                "scanned_bytes": scanned_bytes,
                "truncated_bytes": truncated_bytes,
                "log_end_offset": next_offset,
            },
        )
    return next_offset, state


def _replay_into(state: ProducerStateManager, segment: LogSegment):
    """What recovery feeds each batch carrying a producer id (the others change no state)."""
    def on_batch(header: BatchHeader, chunk, position: int) -> None:
        item = header
        if header.is_control:
            item = ControlBatch(header, read_end_txn_marker(chunk, header._replace(position=position)))
        completed = state.apply(state.validate([item], header.max_timestamp, origin="recovery"))
        for txn in aborted_entries(completed, state.first_unstable_offset()):
            segment.txn_index.append(txn)

    return on_batch


def replay_batches(
    segments: list[LogSegment], bases: list[int], end: int, from_offset: int
) -> Iterator[BatchHeader | ControlBatch]:
    """Every batch from `from_offset` to `end`, control batches with their marker: what
    producer state is rebuilt from.

    A segment starting at or past `end` is not opened: in recovery that is the segment about
    to be rebuilt, whose index a crash left untrusted and preallocated (10 MB by default);
    a lookup in it faulted in pages of the sparse file, seconds over 1,000 partitions."""
    i = max(0, bisect.bisect_right(bases, from_offset) - 1)
    for segment in segments[i:]:
        if segment.base_offset >= end:
            return
        start = segment.find(from_offset)
        if start is None:
            continue
        for header in segment.headers_from(start.position):
            if header.base_offset >= end:
                return
            if header.is_control:
                data = segment.read_batch(header)
                yield ControlBatch(header, read_end_txn_marker(data, header._replace(position=0)))
            else:
                yield header
