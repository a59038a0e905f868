"""One cleaning pass over one log, run on a cleaner thread (Kafka's `Cleaner.doClean`).

The pass works from a `CleanTask`, a snapshot of the log taken on the event loop thread,
and touches only files: the sealed segments it reads (immutable once rolled) and the
`.cleaned` files it writes. It never reads or changes a `Log` object; `swap.py` applies the
result on the event loop thread.

1. Offset map: the latest offset of each key in the dirty section [first dirty offset,
   first uncleanable offset), aborted transactions and markers left out. A full map ends the
   pass early, at a batch boundary.
2. Every segment from the log start up to the map's end is rewritten, grouped as Kafka
   groups them (a group's logs fit in `segment.bytes`, its indexes in `segment.index.bytes`,
   its offsets in 32 bits relative to its base) into one `.cleaned` segment per group. Batches
   at or past the map's end are copied as they are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ...durability import fsync, on_fsync_failure
from ...records.batch import HEADER_SIZE, BatchHeader, read_header
from ...records.control import parse_control_batch
from ..index import OffsetIndex, TimeIndex
from ..segment import segment_name
from ..txn_index import AbortedTxn, TransactionIndex
from .filter import BatchFilter, OffsetMap, TxnTracker, map_batch

__all__ = ["SegmentInfo", "CleanTask", "CleanedGroup", "CleanResult", "Throttler", "CleaningAborted",
           "clean", "cleaned_suffix_paths", "discard", "init_worker", "run_in_worker"]

_MAX_RELATIVE_OFFSET = 2**31 - 1
CLEANED = ".cleaned"
RANGE = ".range"  # sidecar holding the offset where a cleaned group ends (see swap.py)


class CleaningAborted(Exception):
    """The broker is stopping, or the log changed under the pass: drop its work."""


@dataclass(frozen=True)
class SegmentInfo:
    base: int
    next_base: int  # base offset of the following segment
    log_path: Path
    size: int


@dataclass(frozen=True)
class CleanTask:
    """What a pass needs to know about a log, read on the event loop thread."""

    directory: Path
    segments: list[SegmentInfo]  # every non-active segment, oldest first
    first_dirty: int
    first_uncleanable: int
    aborted: list[AbortedTxn]
    last_batches: dict[int, int]
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_max_bytes: int
    index_interval_bytes: int


@dataclass(frozen=True)
class CleanedGroup:
    base: int
    end: int  # the next segment's base: old segments with bases in [base, end) are replaced
    replaced: list[int]  # base offsets of the old segments


@dataclass
class CleanResult:
    groups: list[CleanedGroup]
    end_offset: int  # the next pass's first dirty offset
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    earliest_horizon: int | None = None
    elapsed_s: float = 0.0


class Throttler:
    """Kafka's Throttler: hold the cleaners' combined I/O under `log.cleaner.io.max.bytes.per.second`,
    measured over 300 ms windows and shared by every cleaner thread."""

    CHECK_INTERVAL_S = 0.3

    def __init__(self, bytes_per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = bytes_per_second
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._count = 0

    def throttle(self, size: int) -> None:
        pause = 0.0
        with self._lock:
            self._count += size
            now = self._clock()
            elapsed = now - self._start
            if elapsed >= self.CHECK_INTERVAL_S:
                if self._count / elapsed > self.rate:
                    pause = self._count / self.rate - elapsed
                self._start, self._count = now + pause, 0
        if pause > 0:
            self._sleep(pause)


_READ_CHUNK = 512 * 1024  # Kafka's log.cleaner.io.buffer.size default


def _read_batches(path: Path, throttler: Throttler, check: Callable[[], None]) -> Iterator[tuple[bytes, BatchHeader]]:
    """(chunk, header) for each batch of a sealed segment file; header.position is in the chunk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while size - position >= HEADER_SIZE:
            check()
            chunk = os.pread(fd, min(_READ_CHUNK, size - position), position)
            throttler.throttle(len(chunk))
            offset = 0
            while len(chunk) - offset >= HEADER_SIZE:
                header = read_header(chunk, offset)
                if header.size < HEADER_SIZE:
                    raise ValueError(f"{path}: corrupt batch length at byte {position + offset}")
                if offset + header.size > len(chunk):
                    if offset == 0:  # a batch bigger than the chunk
                        chunk = os.pread(fd, header.size, position)
                        throttler.throttle(len(chunk))
                        continue
                    break
                yield chunk, header
                offset += header.size
            if offset == 0:
                raise ValueError(f"{path}: torn batch at byte {position}")
            position += offset
    finally:
        os.close(fd)


def _build_offset_map(task: CleanTask, offset_map: OffsetMap, throttler: Throttler,
                      check: Callable[[], None]) -> int:
    """Map the dirty section; returns the offset the pass cleans up to."""
    txns = TxnTracker(list(task.aborted))
    for segment in task.segments:
        if segment.next_base <= task.first_dirty or segment.base >= task.first_uncleanable:
            continue
        for chunk, header in _read_batches(segment.log_path, throttler, check):
            if header.base_offset < task.first_dirty:
                continue
            if header.base_offset >= task.first_uncleanable:
                return task.first_uncleanable
            if header.is_control:
                marker = parse_control_batch(chunk, header)
                txns.on_control_batch(header, None if marker is None else marker.commit)
            elif not txns.on_data_batch(header):
                if len(offset_map) and len(offset_map) + header.records_count > offset_map.capacity:
                    return header.base_offset  # full: the rest waits for the next pass
                map_batch(chunk, header, offset_map)
    return task.first_uncleanable


def _index_sizes(segment: SegmentInfo) -> tuple[int, int]:
    """Sizes of a sealed segment's (trimmed) offset and time indexes."""
    sizes = []
    for ext in (".index", ".timeindex"):
        try:
            sizes.append(os.stat(segment.log_path.with_suffix(ext)).st_size)
        except FileNotFoundError:
            sizes.append(0)
    return sizes[0], sizes[1]


def _group(segments: list[SegmentInfo], task: CleanTask, end_offset: int) -> list[list[SegmentInfo]]:
    """Kafka's groupSegmentsBySize."""
    groups = []
    rest = [s for s in segments if s.base < end_offset]
    while rest:
        group = [rest.pop(0)]
        log_size = group[0].size
        index_size, time_size = _index_sizes(group[0])
        while rest:
            nxt = rest[0]
            nxt_index, nxt_time = _index_sizes(nxt)
            last_offset = min(nxt.next_base, end_offset) - 1
            if (log_size + nxt.size > task.segment_bytes
                    or index_size + nxt_index > task.index_max_bytes
                    or time_size + nxt_time > task.index_max_bytes
                    or last_offset - group[0].base > _MAX_RELATIVE_OFFSET):
                break
            group.append(rest.pop(0))
            log_size += nxt.size
            index_size += nxt_index
            time_size += nxt_time
        groups.append(group)
    return groups


def cleaned_suffix_paths(directory: Path, base: int) -> list[Path]:
    name = segment_name(base)
    return [directory / f"{name}{ext}{CLEANED}" for ext in (".log", ".index", ".timeindex", ".txnindex", RANGE)]


@dataclass
class _GroupWriter:
    task: CleanTask
    base: int
    kept_markers: set[int] = field(default_factory=set)

    def write(self, group: list[SegmentInfo], filt: BatchFilter, end_offset: int, throttler: Throttler,
              check: Callable[[], None], result: CleanResult) -> CleanedGroup:
        task, base = self.task, self.base
        log_path, index_path, time_path, txn_path, range_path = cleaned_suffix_paths(task.directory, base)
        offset_index = OffsetIndex(index_path, base, task.index_max_bytes)
        time_index = TimeIndex(time_path, base, task.index_max_bytes)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        position = since_index = 0
        max_ts = (-1, base)
        try:
            for segment in group:
                for chunk, header in _read_batches(segment.log_path, throttler, check):
                    result.bytes_read += header.size
                    if header.base_offset >= end_offset:
                        out = memoryview(chunk)[header.position:header.position + header.size]
                    else:
                        out = filt.apply(chunk, header)
                    if out is None:
                        continue
                    written = read_header(out)
                    if header.is_control:
                        self.kept_markers.add(header.base_offset)
                    if written.max_timestamp > max_ts[0]:
                        max_ts = (written.max_timestamp, written.base_offset)
                    if since_index > task.index_interval_bytes:
                        offset_index.append(written.base_offset, position)
                        time_index.maybe_append(*max_ts)
                        since_index = 0
                    view = memoryview(out)
                    while view:
                        view = view[os.write(fd, view):]
                    throttler.throttle(len(out))
                    since_index += len(out)
                    position += len(out)
            if max_ts[0] >= 0:
                time_index.maybe_append(*max_ts)
            fsync(fd, log_path)
        finally:
            os.close(fd)
            offset_index.close()
            time_index.close()
        for path in (index_path, time_path):  # an index with no entries still has its (empty) file
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        end = group[-1].next_base
        entries = sorted((t for t in task.aborted if t.last_offset in self.kept_markers and base <= t.last_offset < end),
                         key=lambda t: t.last_offset)
        if entries:
            txn_index = TransactionIndex(txn_path, base)
            for txn in entries:
                txn_index.append(txn)
            txn_index.flush()
            txn_index.close()
        _write_fsynced(range_path, str(end).encode())
        result.bytes_written += position
        return CleanedGroup(base, end, [s.base for s in group])


def _write_fsynced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        fsync(fd, path)
    finally:
        os.close(fd)


def clean(task: CleanTask, offset_map: OffsetMap, throttler: Throttler, check: Callable[[], None]) -> CleanResult:
    """Write the cleaned segments of `task` as `.cleaned` files; the caller swaps them in."""
    started = time.monotonic()
    end_offset = _build_offset_map(task, offset_map, throttler, check)
    result = CleanResult([], end_offset)
    filt = BatchFilter(offset_map, TxnTracker(list(task.aborted)), task.now_ms, task.delete_retention_ms,
                       task.last_batches)
    try:
        for group in _group(task.segments, task, end_offset):
            writer = _GroupWriter(task, group[0].base)
            result.groups.append(writer.write(group, filt, end_offset, throttler, check, result))
    except BaseException:
        discard(task.directory, [g.base for g in result.groups] + [s.base for s in task.segments])
        raise
    result.records_read, result.records_kept = filt.records_read, filt.records_kept
    result.earliest_horizon = filt.earliest_horizon
    result.elapsed_s = time.monotonic() - started
    return result


_PR_SET_PDEATHSIG = 1


_WORKER_NICENESS = 10


def _report_to_broker(path: str, exc: OSError) -> None:
    """A failed fsync in the worker raises LogDirOffline, which goes back to the broker
    (durability.failed_elsewhere): the broker, not the worker, must go offline."""


def init_worker() -> None:
    """Set up a cleaner worker process. The worker dies with a broker killed with -9, or it could
    go on writing `.cleaned` files next to the restarted broker's (Linux prctl); and it runs
    at a lower CPU priority, so on a busy machine produce and fetch get the CPU first."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.nice(_WORKER_NICENESS)
    on_fsync_failure(_report_to_broker)


def run_in_worker(sender, task: CleanTask, map_memory: int, load_factor: float, io_bytes_per_second: float) -> None:
    """Body of a cleaner worker process: one pass, its own offset map and throttler; the
    result (or the exception) goes back through `sender`."""
    init_worker()
    try:
        outcome = (True, clean(task, OffsetMap(map_memory, load_factor), Throttler(io_bytes_per_second), lambda: None))
    except FileNotFoundError as exc:  # retention or a deletion got to a segment first
        outcome = (False, CleaningAborted(str(exc)))
    except Exception as exc:
        outcome = (False, exc)
    sender.send(outcome)
    sender.close()


def discard(directory: Path, bases: list[int]) -> None:
    """Remove the `.cleaned` files of an abandoned pass."""
    for base in set(bases):
        for path in cleaned_suffix_paths(directory, base):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
