"""A bound on how much freshly appended log data the broker keeps in the OS page cache.

A broker writes every produced byte into page-cache pages. Kafka leaves those to the kernel,
which keeps every written page until memory runs short, so a busy broker's page cache keeps
growing into memory it has not touched before. On a VM whose host hands out guest memory
lazily and takes free memory back (free page reporting, balloon, DAMON: Firecracker and many
CI and cloud VMs), touching such memory costs a trip to the host for every page, and appends
run at a fraction of the speed they reach in memory that was freed a moment ago.

`RecentAppends` keeps only the last `log.page.cache.max.bytes` appended across all partitions
cached. Each MiB appended to a segment is handed to writeback at once (`sync_file_range`, which
does not wait), and once more than the budget has been appended since, a thread of its own waits
until the oldest MiBs are written back and drops their pages (`posix_fadvise(DONTNEED)`); the
kernel hands the freed pages to the next appends. The thread takes them in steps (an eighth of
the budget, at most `EVICT_STEP_BYTES`), each segment's share of a step as one range: a job per
MiB cost the broker an open, a wake-up and two context switches each, about 4% of its CPU on
the Spark sinks' produce path. The steps evict down to below the budget, never later. The kernel drops only clean pages, and on a busy disk a
chunk can still be dirty or under writeback when it leaves the budget: dropped from the event
loop without waiting, such pages stayed cached for good once appends stopped (10 of 12 MB in a
test at load 15). Consumers at the tail read from the cache as before; consumers further behind
read from disk, as on a broker whose cache the kernel reclaimed. Durability does not change:
writeback only starts earlier, only clean pages are dropped, and the thread waits on a
descriptor of its own, so a writeback error it sees is still reported to the segment's fsync.
`0` turns this off and leaves everything to the kernel, as Kafka does.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .segment import LogSegment

__all__ = ["RecentAppends", "CHUNK_BYTES", "EVICT_STEP_BYTES"]

log = logging.getLogger(__name__)

# Writeback starts, and the budget is counted, in steps of at least this many bytes per segment.
CHUNK_BYTES = 1 << 20
# Past the budget, chunks leave the page cache until this much below it (at most an eighth of it).
EVICT_STEP_BYTES = 8 << 20

_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4


def _load_sync_file_range():
    """The C library's sync_file_range, or None where there is none (not Linux). Looked up in
    the symbols the interpreter already has loaded (libc among them): `ctypes.util.find_library`
    ran `ldconfig -p` in a subprocess at every broker start."""
    if not hasattr(os, "posix_fadvise"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def _call_sync_file_range(fd: int, start: int, length: int, flags: int) -> None:
    if _sync_file_range(fd, start, length, flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def start_writeback(fd: int, start: int, length: int) -> None:
    """Queue the range's dirty pages for writeback without waiting for it."""
    _call_sync_file_range(fd, start, length, _SYNC_FILE_RANGE_WRITE)


def drop_clean_pages(fd: int, end: int) -> None:
    """Drop the cached pages of [0, end) that are clean; pages still dirty or under writeback stay."""
    os.posix_fadvise(fd, 0, end, os.POSIX_FADV_DONTNEED)


def write_back_and_drop_all(ranges: list[tuple[Path, int, int]]) -> None:
    """In the eviction thread: `write_back_and_drop` for each (path, start, end), in order."""
    for path, start, end in ranges:
        write_back_and_drop(path, start, end)


def write_back_and_drop(path: Path, start: int, end: int) -> None:
    """In the eviction thread: wait until [start, end) of the file is written back (all of it:
    the kernel's background writeback may skip pages), then drop [0, end) from the cache. On a
    descriptor of its own: waiting on the segment's would take a writeback error from the
    segment's next fsync. A file already deleted or swapped away is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _call_sync_file_range(fd, start, end - start,
                              _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER)
        drop_clean_pages(fd, end)
    except OSError as exc:
        log.warning("cannot drop %s from the page cache: %s", path, exc)
    finally:
        os.close(fd)


class RecentAppends:
    """Broker-wide FIFO of appended chunks; the oldest leave the page cache past the budget."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes if _sync_file_range is not None else 0
        # Past the budget, evict down to this (see the module's docstring).
        self._evict_to = self.max_bytes - min(EVICT_STEP_BYTES, self.max_bytes // 8)
        self._chunks: deque[tuple[LogSegment, int, int]] = deque()  # (segment, end, bytes)
        self._cached = 0
        self._evictions: ThreadPoolExecutor | None = None  # started at the first eviction

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def appended(self, segment: LogSegment) -> None:
        """Called after every append to `segment`; does nothing until a chunk has filled up."""
        start, end = segment.writeback_started_to, segment.size
        if end - start < CHUNK_BYTES:
            return
        try:
            segment.start_writeback(start, end)
        except OSError as exc:
            log.warning("cannot start writeback of %s: %s", segment.log_path, exc)
            return
        self._chunks.append((segment, end, end - start))
        self._cached += end - start
        if self._cached <= self.max_bytes:
            return
        ranges: dict[LogSegment, list[int]] = {}  # a segment's oldest chunks follow each other in its file
        while self._cached > self._evict_to:
            old_segment, old_end, size = self._chunks.popleft()
            self._cached -= size
            span = ranges.get(old_segment)
            if span is None:
                ranges[old_segment] = [old_end - size, old_end]
            else:
                span[1] = old_end
        if self._evictions is None:
            self._evictions = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ottla-page-cache")
        self._evictions.submit(write_back_and_drop_all,
                               [(old_segment.log_path, start, end) for old_segment, (start, end) in ranges.items()])

    def drain(self) -> None:
        """Wait until every chunk past the budget so far has left the page cache."""
        if self._evictions is not None:
            self._evictions.submit(lambda: None).result()

    def close(self) -> None:
        if self._evictions is not None:
            self._evictions.shutdown()
            self._evictions = None
