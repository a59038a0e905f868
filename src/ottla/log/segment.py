"""One log segment: `<base offset>.log` plus its sparse `.index` and `.timeindex`.

The `.log` holds already-validated, offset-assigned batches back to back. Appends are one
`os.write` of the bytes the log patched; reads are `os.pread` of whole batches, never a decode.
Files open lazily so a cleanly shut down broker can load thousands of segments without I/O,
and descriptors follow need, not size, as Kafka's lazy segments do: a new segment's .log is
closed again until its first append, a sealed segment gives its descriptors back, and only
the most recently read `MAX_OPEN_SEALED` sealed segments keep theirs between reads.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator

from ..records.crc import crc32c

from ..errors import ErrorCode, KafkaError
from ..records.batch import CRC_START, HEADER, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, read_header
from . import page_cache
from .file_records import LAZY_MIN_BYTES, FileRecords
from .index import OffsetIndex, TimeIndex
from .txn_index import TransactionIndex, index_path
from ..durability import fsync

__all__ = ["LogSegment", "segment_name"]

# How much of the .log one pread takes while walking batch headers.
_SCAN_CHUNK = 64 * 1024
# The first pread of a walk expected to end within about one index interval (`index.interval.bytes`,
# 4 KiB by default) of an indexed batch: a Fetch's `find` and the batches `read` walks past its
# boundary. 64 KiB there was most of what a Fetch of a partition read besides the records it sends.
_SHORT_SCAN_CHUNK = 8 * 1024
# Bigger chunks for recovery, which reads whole batches to check their CRCs.
_RECOVERY_CHUNK = 4 * 1024 * 1024

_BASE_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


def _last_offset(buf, position: int) -> int:
    base_offset = _BASE_AND_LENGTH.unpack_from(buf, position)[0]
    return base_offset + _LAST_OFFSET_DELTA.unpack_from(buf, position + _LAST_OFFSET_DELTA_AT)[0]


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


MAX_OPEN_SEALED = 128


class _RecentlyReadSealed:
    """The sealed segments that keep their files open between reads, least recently read first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._segments: OrderedDict[LogSegment, None] = OrderedDict()

    def touch(self, segment: "LogSegment") -> None:
        self._segments[segment] = None
        self._segments.move_to_end(segment)
        while len(self._segments) > self.capacity:
            self._segments.popitem(last=False)[0].release()

    def forget(self, segment: "LogSegment") -> None:
        self._segments.pop(segment, None)


_open_sealed = _RecentlyReadSealed(MAX_OPEN_SEALED)


class LogSegment:
    """A segment's files and its in-memory bookkeeping (size, max timestamp, index cadence)."""

    def __init__(self, directory: Path, base_offset: int, *, index_max_bytes: int, index_interval_bytes: int):
        name = segment_name(base_offset)
        self.base_offset = base_offset
        self.log_path = directory / f"{name}.log"
        self._index_max_bytes = index_max_bytes
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self.index_interval_bytes = index_interval_bytes
        # Sealed: no more appends; its .log opens read-only, and only while recently read.
        self.sealed = False
        self._fd = -1
        self._size = -1  # unknown until the file is opened or stat'ed
        self._bytes_since_index = 0
        # (max timestamp, base offset of the batch carrying it); loaded lazily from the time index.
        self._max_timestamp: tuple[int, int] | None = None
        self._first_timestamp: int | None = None
        self._txn_index: TransactionIndex | None = None
        # Where the .log's last writeback started (see page_cache.RecentAppends).
        self.writeback_started_to = 0
        # Bumped whenever bytes already written may change or vanish (truncation, deletion,
        # the cleaner's swap): a FileRecords built before can no longer be sent.
        self.version = 0

    @property
    def offset_index(self) -> OffsetIndex:
        """Made on first use, as Kafka's LazyIndex: a start builds no index object for the
        segments nobody reads or appends to."""
        if self._offset_index is None:
            self._offset_index = OffsetIndex(self._index_path(".index"), self.base_offset, self._index_max_bytes)
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        if self._time_index is None:
            self._time_index = TimeIndex(self._index_path(".timeindex"), self.base_offset, self._index_max_bytes)
        return self._time_index

    def _index_path(self, suffix: str) -> Path:
        return self.log_path.parent / f"{segment_name(self.base_offset)}{suffix}"

    def _made_indexes(self) -> list[OffsetIndex | TimeIndex]:
        return [index for index in (self._offset_index, self._time_index) if index is not None]

    @property
    def txn_index(self) -> TransactionIndex:
        """Opened on first use: most segments never hold an aborted transaction."""
        if self._txn_index is None:
            self._txn_index = TransactionIndex(index_path(self.log_path.parent, self.base_offset), self.base_offset)
        return self._txn_index

    # -- files -------------------------------------------------------------------------------

    def _open(self) -> int:
        if self.sealed:
            if self._fd < 0:  # never O_CREAT: a segment deleted meanwhile must not come back empty
                self._fd = os.open(self.log_path, os.O_RDONLY)
                self._size = self.writeback_started_to = os.fstat(self._fd).st_size
            _open_sealed.touch(self)
        elif self._fd < 0:
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = self.writeback_started_to = os.fstat(self._fd).st_size
        return self._fd

    def open_for_read(self) -> int:
        """The .log's descriptor, for a FileRecords read as the socket drains."""
        return self._open()

    def create(self) -> None:
        """Create the .log and empty index files, holding no descriptor: the first append opens
        the .log, and indexes are mapped only once they get entries."""
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        self._size = 0

    def release(self) -> None:
        """Let go of the files without writing to them: a sealed segment not read lately, or
        one the cleaner is swapping out (see log/cleaner/swap.py). The next use reopens them."""
        _open_sealed.forget(self)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for index in self._made_indexes():
            index.close()
        if self._txn_index is not None:
            self._txn_index.close()

    def retire(self) -> None:
        """The cleaner swapped this segment's files for cleaned ones under the same names."""
        self.version += 1
        self.release()

    def mark_sealed(self) -> None:
        """A segment below the active one, loaded from disk: read-only from now on."""
        self.sealed = True
        self.release()

    def reactivate(self) -> None:
        """A truncation made this sealed segment the active one again."""
        if self.sealed:
            self.release()
            self.sealed = False

    @property
    def size(self) -> int:
        if self._size < 0:  # retention sums sizes: that needs no descriptor
            if self.sealed:
                self._size = os.stat(self.log_path).st_size
            else:
                self._open()
        return self._size

    def flush(self) -> None:
        """fsync the .log and its indexes."""
        if self._fd >= 0:
            fsync(self._fd, self.log_path)
        if self._txn_index is not None:
            self._txn_index.flush()
        for index in self._made_indexes():
            if index.is_open:
                index.flush()

    def duplicate_fd(self) -> int | None:
        """A duplicate of the .log's descriptor (see Log.duplicate_data_fds)."""
        return os.dup(self._fd) if self._fd >= 0 else None

    def start_writeback(self, start: int, end: int) -> None:
        if self._fd >= 0:
            page_cache.start_writeback(self._fd, start, end - start)
        self.writeback_started_to = end

    def seal(self, *, sync: bool = True) -> list[tuple[int, Path]]:
        """The segment stops being active: record its final max timestamp, trim and fsync
        everything, and give the descriptors back. With `sync=False` nothing is fsynced:
        the returned duplicate descriptors (with their paths) are, later and elsewhere."""
        deferred: list[tuple[int, Path]] = []
        if self._fd >= 0:
            if sync:
                fsync(self._fd, self.log_path)
            else:
                deferred.append((os.dup(self._fd), self.log_path))
        if self._txn_index is not None:
            if sync:
                self._txn_index.flush()
            elif (fd := self._txn_index.duplicate_fd()) is not None:
                deferred.append((fd, self._txn_index.path))
        if self._max_timestamp is not None and self._max_timestamp[0] >= 0:
            self.time_index.maybe_append(*self._max_timestamp)
        for index in self._made_indexes():
            if (fd := index.close(sync=sync)) is not None:
                deferred.append((fd, index.path))
        self.sealed = True
        self.release()
        return deferred

    def close(self) -> None:
        self.seal()
        _open_sealed.forget(self)
        if self._txn_index is not None:
            self._txn_index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self, *, unlink: bool = True) -> None:
        """Release the segment's files and remove them; `unlink=False` when its directory was
        renamed away to be removed whole by the disk worker (the old names are gone)."""
        self.version += 1
        _open_sealed.forget(self)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for index in (self.offset_index, self.time_index) if unlink else self._made_indexes():
            index.delete(unlink=unlink)
        if self._txn_index is not None:
            self._txn_index.delete(unlink=unlink)
        elif unlink:  # never opened: no object to make just to remove its file
            index_path(self.log_path.parent, self.base_offset).unlink(missing_ok=True)
        if unlink:
            self.log_path.unlink(missing_ok=True)

    # -- append ------------------------------------------------------------------------------

    def append(self, parts, headers: list[BatchHeader]) -> None:
        """Write already patched batches (the buffers of `parts`, in order) with one writev and
        add index entries every interval bytes."""
        fd = self._open()
        start = self._size
        size = sum(len(part) for part in parts)
        try:
            written = os.writev(fd, parts)
            if written < size:  # regular files only write short when the disk fills
                rest = memoryview(b"".join(parts))[written:]
                while rest:
                    rest = rest[os.write(fd, rest):]
        except OSError as exc:
            os.ftruncate(fd, start)  # never leave a torn batch behind a live log
            raise KafkaError(ErrorCode.kafka_storage_error, f"write to {self.log_path} failed: {exc}") from exc
        max_ts = self.max_timestamp_and_offset()
        for header in headers:
            if header.max_timestamp > max_ts[0]:
                max_ts = (header.max_timestamp, header.base_offset)
            if self._bytes_since_index > self.index_interval_bytes:
                self.offset_index.append(header.base_offset, start + header.position)
                self.time_index.maybe_append(*max_ts)
                self._bytes_since_index = 0
            self._bytes_since_index += header.size
        self._max_timestamp = max_ts
        if self._first_timestamp is None and start == 0 and headers:
            self._first_timestamp = headers[0].max_timestamp
        self._size = start + size

    def indexes_full(self) -> bool:
        """Without mapping them: opening an index active preallocates it (10 MB by default),
        which every small partition's indexes got at its first append after a restart."""
        return self.offset_index.is_full or self.time_index.is_full

    def max_timestamp_and_offset(self) -> tuple[int, int]:
        """(largest batch max timestamp, base offset of that batch); (-1, base) when empty."""
        if self._max_timestamp is None:
            last = self.time_index.last_entry()
            self._max_timestamp = last if last is not None else (-1, self.base_offset)
        return self._max_timestamp

    def first_batch_timestamp(self) -> int | None:
        """Max timestamp of the first batch, which segment.ms measures the segment's age from."""
        if self._first_timestamp is None and self.size >= HEADER_SIZE:
            self._first_timestamp = read_header(os.pread(self._open(), HEADER_SIZE, 0)).max_timestamp
        return self._first_timestamp

    # -- read --------------------------------------------------------------------------------

    def headers_from(self, position: int, first_chunk: int = _SCAN_CHUNK) -> Iterator[BatchHeader]:
        """Headers of the batches from byte `position` on, read a chunk at a time.

        The positions in the yielded headers are file positions. The descriptor is looked up
        per chunk: a consumer pausing between headers (a rebuild in steps) may see the sealed
        file released meanwhile, and its number reused by another file.
        """
        self._open()  # a sealed file opened afresh learns its size here
        end = self._size
        chunk_size = first_chunk
        while end - position >= HEADER_SIZE:
            chunk = os.pread(self._open(), min(chunk_size, end - position), position)
            chunk_size = _SCAN_CHUNK
            offset = 0
            while len(chunk) - offset >= HEADER_SIZE:
                header = read_header(chunk, offset)
                if header.batch_length + LOG_OVERHEAD < HEADER_SIZE:
                    return
                yield header._replace(position=position + offset)
                offset += header.batch_length + LOG_OVERHEAD
            position += offset

    def read_batch(self, header: BatchHeader) -> bytes:
        return os.pread(self._open(), header.size, header.position)

    def find(self, offset: int) -> BatchHeader | None:
        """Header of the first batch whose last offset is >= `offset`, or None past the end."""
        _, position = self.offset_index.lookup(offset)
        for header in self.headers_from(position, _SHORT_SCAN_CHUNK):
            if header.base_offset + header.last_offset_delta >= offset:
                return header
        return None

    def read(self, position: int, max_bytes: int, max_offset: int, min_one_batch: bool,
             lazy: bool = False) -> "bytes | memoryview | FileRecords":
        """Whole batches from `position`: at most `max_bytes` (but one batch at least when asked),
        none whose last offset reaches `max_offset`.

        The offset index supplies a batch boundary that is both inside the byte limit and below
        `max_offset`; only the batches after it are walked, unpacking just offset and length.
        Base offsets ascend, so only the last batch kept can straddle `max_offset`. `lazy`
        reads only the headers of those walked batches and returns a FileRecords the connection
        reads as the socket drains (when it is at least LAZY_MIN_BYTES long).
        """
        fd = self._open()
        available = self._size - position
        limit = min(max_bytes, available)
        boundary = min(
            self.offset_index.floor_position(position + limit),
            self.offset_index.lookup(max_offset)[1],
        )
        if lazy:
            return self._read_lazy(fd, position, max(0, boundary - position), limit, max_offset, min_one_batch)
        data = os.pread(fd, max(0, limit), position)
        length = len(data)
        end = max(0, boundary - position)
        last = -1
        while length - end >= HEADER_SIZE:
            base_offset, batch_length = _BASE_AND_LENGTH.unpack_from(data, end)
            size = batch_length + LOG_OVERHEAD
            if base_offset >= max_offset or size < HEADER_SIZE or end + size > length:
                break
            last = end
            end += size
        if last >= 0 and _last_offset(data, last) >= max_offset:
            end = last
        if end == 0 and min_one_batch and available >= HEADER_SIZE:
            first = data if length >= HEADER_SIZE else os.pread(fd, HEADER_SIZE, position)
            if _last_offset(first, 0) >= max_offset:
                return b""
            size = _BASE_AND_LENGTH.unpack_from(first, 0)[1] + LOG_OVERHEAD
            return data[:size] if length >= size else os.pread(fd, size, position)
        return data if end == length else memoryview(data)[:end]  # no copy of what is kept

    def _read_lazy(self, fd: int, position: int, end: int, limit: int, max_offset: int,
                   min_one_batch: bool) -> "bytes | FileRecords":
        """`read` with `lazy`, `end` its boundary's distance from `position`: the batches past
        the boundary are walked by their headers alone, read `_SHORT_SCAN_CHUNK` at a time (the
        bytes up to the limit were read whole before: up to a whole batch, copied and dropped,
        for each partition of each Fetch)."""
        chunk, at = b"", end  # `chunk` holds the bytes from `position + at`
        last = last_offset = -1
        while limit - end >= HEADER_SIZE:
            if end + HEADER_SIZE > at + len(chunk):
                at = end
                chunk = os.pread(fd, min(_SHORT_SCAN_CHUNK, limit - end), position + end)
                if len(chunk) < HEADER_SIZE:
                    break
            base_offset, batch_length = _BASE_AND_LENGTH.unpack_from(chunk, end - at)
            size = batch_length + LOG_OVERHEAD
            if base_offset >= max_offset or size < HEADER_SIZE or end + size > limit:
                break
            last, last_offset = end, _last_offset(chunk, end - at)
            end += size
        if last >= 0 and last_offset >= max_offset:
            end = last
        if end == 0 and min_one_batch and self._size - position >= HEADER_SIZE:
            first = os.pread(fd, HEADER_SIZE, position)
            if _last_offset(first, 0) >= max_offset:
                return b""
            size = _BASE_AND_LENGTH.unpack_from(first, 0)[1] + LOG_OVERHEAD
            return FileRecords(self, position, size) if size >= LAZY_MIN_BYTES else os.pread(fd, size, position)
        if end >= LAZY_MIN_BYTES:
            return FileRecords(self, position, end)
        return os.pread(fd, end, position) if end else b""

    # -- truncation and recovery -------------------------------------------------------------

    def truncate_to(self, offset: int) -> int | None:
        """Drop every batch whose last offset is >= `offset`; returns the base offset of the
        first batch dropped, or None if nothing was."""
        self.reactivate()
        header = self.find(offset)
        if header is None:
            return None
        os.ftruncate(self._fd, header.position)
        self.version += 1
        self._size = header.position
        self.writeback_started_to = min(self.writeback_started_to, self._size)
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        self.txn_index.truncate_to(header.base_offset)
        self._max_timestamp = None
        self._first_timestamp = None
        self._bytes_since_index = 0
        if self._size:
            self._rescan_max_timestamp()
        return header.base_offset

    def _rescan_max_timestamp(self) -> None:
        last = self.time_index.last_entry()
        max_ts = last if last is not None else (-1, self.base_offset)
        _, position = self.offset_index.lookup(max_ts[1])
        for header in self.headers_from(position):
            if header.max_timestamp > max_ts[0]:
                max_ts = (header.max_timestamp, header.base_offset)
        self._max_timestamp = max_ts

    def recover(self, on_producer_batch: Callable[[BatchHeader, bytes, int], None] | None = None,
                epoch_starts: list[tuple[int, int]] | None = None) -> tuple[int, int]:
        """Validate every batch (length, magic, CRC, ascending offsets), rebuild the offset and
        time indexes (trimmed to their entries), and cut the file at the first bad batch.
        Returns (next offset, bytes cut).

        `on_producer_batch(header, chunk, position_in_chunk)` sees each intact batch that
        carries a producer id, in order (the header carries its file position), so the log can
        rebuild producer state alongside; batches without one (most of an internal topic) never
        become a BatchHeader: this loop is a kill -9 restart's cost per batch.

        `epoch_starts` gets `(epoch, base offset)` where the batches' leader epoch first rises
        (continuing the list it is given, across segments).
        """
        self.reactivate()
        fd = self._open()
        file_size = self._size
        offset_entries, time_entries = bytearray(), bytearray()
        pack_offset, pack_time = OffsetIndex.entry.pack, TimeIndex.entry.pack
        indexed_ts = None  # the time index's last timestamp: it only takes a higher one
        max_ts, max_ts_offset = -1, self.base_offset
        first_ts = None
        since_index = 0
        interval = self.index_interval_bytes
        self._size = 0
        next_offset = self.base_offset
        position = 0
        valid = True
        unpack = HEADER.unpack_from
        latest_epoch = epoch_starts[-1][0] if epoch_starts else -1
        while valid and file_size - position >= HEADER_SIZE:
            chunk = os.pread(fd, min(_RECOVERY_CHUNK, file_size - position), position)
            view = memoryview(chunk)
            offset = 0
            while len(chunk) - offset >= HEADER_SIZE:
                (base_offset, batch_length, leader_epoch, magic, crc, _, last_delta, _, batch_max_ts,
                 producer_id, _, _, _) = unpack(chunk, offset)
                size = batch_length + LOG_OVERHEAD
                if magic != 2 or size < HEADER_SIZE or position + offset + size > file_size:
                    valid = False
                    break
                if offset + size > len(chunk):
                    if offset == 0:  # a single batch bigger than the chunk
                        chunk = os.pread(fd, size, position)
                        view = memoryview(chunk)
                        continue
                    break
                if base_offset < next_offset or last_delta < 0 or crc32c(view[offset + CRC_START:offset + size]) != crc:
                    valid = False
                    break
                # What `append` does per batch: max timestamp, and an index entry every interval bytes.
                if batch_max_ts > max_ts:
                    max_ts, max_ts_offset = batch_max_ts, base_offset
                if first_ts is None:
                    first_ts = batch_max_ts
                if since_index > interval:
                    offset_entries += pack_offset(base_offset - self.base_offset, position + offset)
                    if indexed_ts is None or max_ts > indexed_ts:
                        time_entries += pack_time(max_ts, max_ts_offset - self.base_offset)
                        indexed_ts = max_ts
                    since_index = 0
                since_index += size
                if epoch_starts is not None and leader_epoch > latest_epoch:
                    epoch_starts.append((leader_epoch, base_offset))
                    latest_epoch = leader_epoch
                if producer_id >= 0 and on_producer_batch is not None:
                    on_producer_batch(read_header(chunk, offset)._replace(position=position + offset), chunk, offset)
                next_offset = base_offset + last_delta + 1
                offset += size
            position += offset
            if offset == 0:
                break
        truncated = file_size - position
        if truncated:
            os.ftruncate(fd, position)
        self.offset_index.rewrite(bytes(offset_entries))  # a crash's 10 MB preallocation goes too
        self.time_index.rewrite(bytes(time_entries))
        self._max_timestamp = (max_ts, max_ts_offset)
        self._first_timestamp = first_ts
        self._bytes_since_index = since_index
        self._size = position
        self.writeback_started_to = min(self.writeback_started_to, position)
        return next_offset, truncated

    def rebuild_indexes(self) -> None:
        """Recreate missing or damaged indexes of a segment below the recovery point."""
        self.recover()
        self.seal()

    def indexes_sane(self) -> bool:
        size = self.size
        return self.offset_index.is_sane(size) and self.time_index.is_sane(size)
