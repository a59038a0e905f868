"""Fetched batches that stay in the segment file until the socket takes them (Kafka's FileRecords).

A Fetch response is encoded with a `FileRecords` in place of the record bytes: the encoder
writes its length and keeps it by reference, and the connection reads it a write slice at a
time as the socket drains. A consumer that never reads its responses therefore costs one
slice, not the whole `fetch.max.bytes` response (200 such consumers of an 8 MB log held
1.6 GB when responses were read whole).

The segment may change between encoding and sending: retention deletes it, a follower
truncates it, the cleaner swaps its files. Each of these bumps the segment's `version`; a
read after that, or one that comes back short, raises `RecordsGone` and the connection is
closed mid-frame, as Kafka closes it when its FileRecords was truncated during the write.

The connection reads on the event loop only what the page cache holds (`read_cached`, a
`RWF_NOWAIT` read that fails rather than wait for the disk); a lagging consumer's cold
pages are read in a worker thread (`detached_read`), so the disk's latency is not the loop's.
`read_off_loop` does both, for the connection sending records and for the Fetch v0-3 walk
that sizes their down-conversion.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .segment import LogSegment

__all__ = ["FileRecords", "RecordsGone", "LAZY_MIN_BYTES"]

# Slices shorter than this are read at once: not worth a deferred read.
LAZY_MIN_BYTES = 64 * 1024
# Threads for fetched pages not in the page cache: their own, so lagging consumers waiting on
# the disk never queue ahead of the default executor's decoding and coordinator syncs.
_COLD_READS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ottla-cold-read")


class RecordsGone(Exception):
    """The segment changed after the response was built: its bytes can no longer be sent."""


class FileRecords:
    __slots__ = ("segment", "position", "size", "_version")

    def __init__(self, segment: "LogSegment", position: int, size: int):
        self.segment = segment
        self.position = position
        self.size = size
        self._version = segment.version

    def __len__(self) -> int:
        return self.size

    def read(self, start: int, length: int) -> bytes:
        """`length` bytes from `start` within these records (waiting for the disk if need be)."""
        try:
            data = os.pread(self._descriptor(), length, self.position + start)
        except OSError as exc:
            raise RecordsGone(f"cannot read {self.segment.log_path}: {exc}") from None
        return self.checked(data, length)

    def read_cached(self, start: int, length: int) -> bytearray | None:
        """`read`, if the page cache holds all of it; None when the read would wait for the disk."""
        data = bytearray(length)
        try:
            read = os.preadv(self._descriptor(), [data], self.position + start, os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without RWF_NOWAIT
                return None
            raise RecordsGone(f"cannot read {self.segment.log_path}: {exc}") from None
        return data if read == length else None  # partly cached (or cut short: `read` tells)

    async def read_off_loop(self, start: int, length: int) -> bytes | bytearray:
        """`read` on the event loop if the page cache holds it, else in a cold-read thread."""
        data = self.read_cached(start, length)
        if data is None:  # a lagging consumer's cold pages: the disk waits in a thread
            data = self.checked(await asyncio.get_running_loop().run_in_executor(
                _COLD_READS, self.detached_read(start, length)), length)
        return data

    def detached_read(self, start: int, length: int) -> Callable[[], bytes]:
        """`read` for a worker thread: it reads a duplicate of the descriptor, which the loop
        cannot close (an evicted or deleted segment's number could meanwhile name another
        file). Pass what it returns through `checked` on the loop."""
        fd = os.dup(self._descriptor())
        path = self.segment.log_path

        def read() -> bytes:
            try:
                return os.pread(fd, length, self.position + start)
            except OSError as exc:
                raise RecordsGone(f"cannot read {path}: {exc}") from None
            finally:
                os.close(fd)
        return read

    def checked(self, data: bytes, length: int) -> bytes:
        """`data`, read for `length` bytes, unless the segment changed or ended meanwhile."""
        if self.segment.version != self._version:
            raise RecordsGone(f"segment {self.segment.log_path} changed after the response was built")
        if len(data) != length:
            raise RecordsGone(f"segment {self.segment.log_path} was truncated after the response was built")
        return data

    def _descriptor(self) -> int:
        if self.segment.version != self._version:
            raise RecordsGone(f"segment {self.segment.log_path} changed after the response was built")
        try:
            return self.segment.open_for_read()
        except OSError as exc:
            raise RecordsGone(f"cannot read {self.segment.log_path}: {exc}") from None
