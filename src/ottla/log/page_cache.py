"""A bound on how much freshly appended log data the broker keeps in the OS page cache.

A broker writes every produced byte into page-cache pages. Kafka leaves those to the kernel,
which keeps every written page until memory runs short, so a busy broker's page cache keeps
growing into memory it has not touched before. On a VM whose host hands out guest memory
lazily and takes free memory back (free page reporting, balloon, DAMON: Firecracker and many
CI and cloud VMs), touching such memory costs a trip to the host for every page, and appends
run at a fraction of the speed they reach in memory that was freed a moment ago.

`RecentAppends` keeps only the last `log.page.cache.max.bytes` appended across all partitions
cached. Each MiB appended to a segment is handed to writeback at once (`sync_file_range`, which
does not wait), and once more than the budget has been appended since, its pages -- clean by
then -- are dropped (`posix_fadvise(DONTNEED)`); the kernel hands the freed pages to the next
appends. Consumers at the tail read from the cache as before; consumers further behind read
from disk, as on a broker whose cache the kernel reclaimed. Durability does not change:
writeback only starts earlier, and only clean pages are dropped. `0` turns this off and leaves
everything to the kernel, as Kafka does.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .segment import LogSegment

__all__ = ["RecentAppends", "CHUNK_BYTES"]

log = logging.getLogger(__name__)

# Writeback starts, and the budget is counted, in steps of at least this many bytes per segment.
CHUNK_BYTES = 1 << 20

_SYNC_FILE_RANGE_WRITE = 2


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


def start_writeback(fd: int, start: int, length: int) -> None:
    """Queue the range's dirty pages for writeback without waiting for it."""
    if _sync_file_range(fd, start, length, _SYNC_FILE_RANGE_WRITE) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def drop_clean_pages(fd: int, end: int) -> None:
    """Drop the cached pages of [0, end) that are clean; pages still dirty or under writeback
    stay, and the next call for the same file gets them."""
    os.posix_fadvise(fd, 0, end, os.POSIX_FADV_DONTNEED)


class RecentAppends:
    """Broker-wide FIFO of appended chunks; the oldest leave the page cache past the budget."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes if _sync_file_range is not None else 0
        self._chunks: deque[tuple[LogSegment, int, int]] = deque()  # (segment, end, bytes)
        self._cached = 0

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
        while self._cached > self.max_bytes:
            old_segment, old_end, size = self._chunks.popleft()
            self._cached -= size
            old_segment.drop_cached_before(old_end)
