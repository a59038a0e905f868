"""Record batches (magic v2) encoded straight from Arrow columns, and Kafka's murmur2 partitioner over them.

The sink's per-record cost was a Python call per row into confluent-kafka (issue 16). Here no Python runs
per record: a record's fields are varints of lengths and deltas, computed for all rows at once with numpy and
laid out with a short key as one head per record; Arrow's `binary_join_element_wise` then lays out, row by row
in C++, the head, value and headers of each record end to end, which is the batch's records section (`_records`:
every partition's rows of a send at once). A header costs the same way (its varints, key and value joined, then
a row's headers joined by `binary_join`). That is a fresh worker's encoder; once the process has moved to numba
(compiled.py: this encoder and the source's walker have cost it numba's load), `encode_partitioned` lays the records out with kernels.py's loops instead (0.1 us per 100-byte record
against 0.35: murmur2, the partition order and the layout in one pass each), the same bytes.

Record layout (records.py): length | attributes 0 | timestamp delta | offset delta | key length | key |
value length | value | header count | (key length | key | value length | value)* ; varints zigzag-encoded,
-1 for a null key, value or header value.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
# Arrow's compute functions called by name: `pyarrow.compute` builds a Python wrapper for each of several
# hundred at its import, 50-100 ms of a fresh Spark Python worker, which has not imported it.
from pyarrow._compute import CastOptions, JoinOptions, call_function

from ..records.batch import CRC_OFFSET, CRC_START, HEADER, HEADER_SIZE, LOG_OVERHEAD, TRANSACTIONAL_BIT
from ..records.crc import crc32c
from . import compiled

__all__ = ["Batch", "Columns", "encode_batches", "encode_partitioned", "encode_sets", "murmur2_partitions"]

_VARINT_BYTES = 5  # lengths and deltas are 32-bit: a zigzag varint of one takes at most 5 bytes
_SHIFTS = np.arange(_VARINT_BYTES, dtype=np.uint64) * np.uint64(7)
_BOUNDS = np.uint64(1) << _SHIFTS[1:]  # a value at or above bound k needs more than k bytes
_CRC = struct.Struct(">I")
_NOTHING = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, np.int32)), pa.py_buffer(b"")])[0]
_REPLACE_NULLS = JoinOptions(null_handling="replace", null_replacement="")
_TO_LARGE = CastOptions.safe(pa.large_binary())
_NOTHING_LARGE = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(np.zeros(2, np.int64)),
                                                              pa.py_buffer(b"")])[0]
# Keys up to this long are copied into the records' heads with numpy, a pass per byte; longer ones are joined.
_SHORT_KEY = 16
_RECORD_MOST = 24  # a record's bytes besides key, value, headers and offset delta: at most 4 varints, 1 attribute


@dataclass(frozen=True)
class Columns:
    """The sink's columns for the rows to write, in order: binary or string arrays, and headers as
    list<struct<key: string, value: binary>>."""

    values: pa.Array
    keys: pa.Array | None = None
    headers: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.values)

    def take(self, rows: np.ndarray) -> Columns:
        pick = pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows.astype(np.int64))])
        return Columns(*(None if c is None else call_function("take", [c, pick])
                         for c in (self.values, self.keys, self.headers)))

    def slice(self, start: int, stop: int) -> Columns:
        return Columns(*(None if c is None else c.slice(start, stop - start)
                         for c in (self.values, self.keys, self.headers)))


@dataclass(frozen=True)
class Batch:
    """One encoded batch and how many records (sequence numbers) it holds."""

    data: bytearray  # kept as built: a copy into bytes would cost a pass over the batch for nothing
    records: int


def _zigzag(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64, copy=False)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def _widths(zigzag: np.ndarray) -> np.ndarray | int:
    """Each varint's size in bytes, or one int when all have the same (lengths of one order: most columns)."""
    if not len(zigzag):
        return 1
    low, high = (int(np.searchsorted(_BOUNDS, bound, "right")) + 1 for bound in (zigzag.min(), zigzag.max()))
    if low == high:
        return low
    return np.searchsorted(_BOUNDS, zigzag, "right").astype(np.int64) + 1


class _Varints:
    """A column of zigzag varints and their sizes (an int when all have one size)."""

    __slots__ = ("zigzag", "widths")

    def __init__(self, values: np.ndarray):
        self.zigzag = _zigzag(values)
        self.widths = _widths(self.zigzag)

    @property
    def width(self) -> int:
        return self.widths if isinstance(self.widths, int) else int(self.widths.max())


class _Short:
    """A binary column of short values (keys of a few bytes), to lay out in a head rather than join as a piece."""

    __slots__ = ("data", "starts", "widths", "width")

    def __init__(self, column: pa.Array, lengths: np.ndarray):
        data = column.buffers()[2]
        offsets = _offsets(column)
        first, last = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
        # The rows' bytes and _SHORT_KEY more (zeros): each row's are read 8 at a time up to its column's widest.
        self.data = np.zeros(last - first + _SHORT_KEY, np.uint8)
        if last > first:
            self.data[:last - first] = np.frombuffer(data, np.uint8, last - first, first)
        self.starts = offsets[:-1].astype(np.int64) - first
        sizes = lengths.clip(0)
        self.width = int(sizes.max()) if len(sizes) else 0
        self.widths = self.width if (sizes == self.width).all() else sizes

    def words(self) -> list[np.ndarray]:
        """Each row's bytes as little-endian words of 8 (its first 8, its next 8, ...; past its end, junk)."""
        at_every_byte = np.ndarray((len(self.data) - 7,), "<u8", self.data, 0, (1,))  # unaligned: one gather each
        return [at_every_byte[self.starts + byte] for byte in range(0, self.width, 8)]


_LOW7 = np.uint64(0x7F)
# The continuation bits of a varint of k bytes packed little-endian in a word: 0x80 in each byte but its last.
_CONTINUED = np.array([sum(0x80 << (8 * i) for i in range(k - 1)) for k in range(_VARINT_BYTES + 1)], "<u8")


def _packed(part: _Varints) -> np.ndarray:
    """Each row's varint as the bytes of a little-endian word (at most 5 of its 8 bytes), continuation bits set."""
    zigzag = part.zigzag
    word = zigzag & _LOW7
    for byte in range(1, part.width):
        word |= ((zigzag >> np.uint64(7 * byte)) & _LOW7) << np.uint64(8 * byte)
    return (word | _CONTINUED[part.widths]).astype("<u8", copy=False)


def _varint_rows(parts: list, n: int, lead_skipped: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | int]:
    """Per row, `parts` end to end, and each row's size: a part is a `_Varints` column, a `_Short` column or
    bytes that every row has. The rows in `lead_skipped` go without their first part (one byte: the previous
    record's header count, which the first record of a batch has no previous record for). Each part takes the
    columns of an n x width byte matrix that its widest value needs, written 8 bytes a row at a time (what a part
    writes past its columns the next part's overwrite, or falls in 8 spare columns); the rows are the matrix's
    rows, less the spare columns and the bytes of shorter values."""
    if not n:  # (a strided view of an empty matrix past its start is refused)
        return np.empty(0, np.uint8), np.zeros(0, np.int64)
    width = sum(len(p) if isinstance(p, bytes) else p.width for p in parts)
    stride = width + 8
    matrix = np.empty((n, stride), np.uint8)
    mask = None
    sizes: np.ndarray | int = 0
    at = 0
    for part in parts:
        if isinstance(part, bytes):
            matrix[:, at:at + len(part)] = np.frombuffer(part, np.uint8)
            at += len(part)
            sizes = sizes + len(part)
            continue
        widths, top = part.widths, part.width
        for byte, word in zip(range(0, top, 8), part.words() if isinstance(part, _Short) else [_packed(part)]):
            np.ndarray((n,), "<u8", matrix, at + byte, (stride,))[:] = word
        if not isinstance(widths, int):
            if mask is None:
                mask = np.zeros((n, stride), bool)
                mask[:, :width] = True
            for byte in range(top):  # a column at a time: a broadcast comparison costs five times as much
                mask[:, at + byte] = widths > byte
        at += top
        sizes = sizes + widths
    if lead_skipped is not None and len(lead_skipped):
        if mask is None:
            mask = np.zeros((n, stride), bool)
            mask[:, :width] = True
        mask[lead_skipped, 0] = False
        sizes = np.full(n, sizes, np.int64) if isinstance(sizes, int) else sizes.copy()
        sizes[lead_skipped] -= 1
    if mask is None:
        return matrix[:, :width].ravel(), sizes
    return matrix[mask], sizes


def _binary(stream: np.ndarray, sizes: np.ndarray | int, n: int) -> pa.Array:
    """A binary array of `n` rows over `stream` cut into pieces of `sizes` bytes (no copy)."""
    if isinstance(sizes, int):
        offsets = np.arange(0, (n + 1) * sizes, sizes, dtype=np.int32)
    else:
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(stream)])


def _varint_column(values: np.ndarray) -> pa.Array:
    """The zigzag varint of each of `values` as a binary array."""
    return _binary(*_varint_rows([_Varints(values)], len(values)), len(values))


def numbers(column: pa.Array, dtype) -> np.ndarray:
    """The values of a fixed-width column as numpy sees them (a null's is undefined), without copying.
    pyarrow's `to_numpy`, like its conversion of any Python scalar, imports pandas: a second or so of CPU
    in every new Spark Python worker, which the sink has no other use for."""
    return np.frombuffer(column.buffers()[1], dtype)[column.offset:column.offset + len(column)]


def valid(column: pa.Array) -> np.ndarray:
    """True for each row that is not null."""
    if not column.null_count:
        return np.ones(len(column), bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], np.uint8), bitorder="little")
    return bits[column.offset:column.offset + len(column)].astype(bool)


def _offsets(column: pa.Array) -> np.ndarray:
    """The n + 1 offsets of a binary or list column's rows into its data."""
    wide = pa.types.is_large_binary(column.type) or pa.types.is_large_list(column.type)
    return np.frombuffer(column.buffers()[1], np.int64 if wide else np.int32)[column.offset:column.offset + len(column) + 1]


def _lengths(column: pa.Array) -> np.ndarray:
    """Byte length per row of a binary column, -1 for null."""
    lengths = np.diff(_offsets(column)).astype(np.int64)
    if column.null_count:
        lengths[~valid(column)] = -1
    return lengths


def as_binary(column: pa.Array) -> pa.Array:
    """A string column viewed as binary: the same bytes, no UTF-8 decode."""
    if pa.types.is_string(column.type):
        return column.view(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.view(pa.large_binary())
    return column


def _join(*columns) -> pa.Array:
    """Row by row, the columns' bytes end to end; a null adds nothing (its length field says -1)."""
    if not any(pa.types.is_large_binary(column.type) for column in columns):
        return call_function("binary_join_element_wise", [*columns, _NOTHING], _REPLACE_NULLS)
    # Arrow joins columns of one type only: large ones (Spark's with spark.sql.execution.arrow.useLargeVarTypes)
    large = [c if pa.types.is_large_binary(c.type) else call_function("cast", [c], _TO_LARGE) for c in columns]
    return call_function("binary_join_element_wise", [*large, _NOTHING_LARGE], _REPLACE_NULLS)


def _header_sections(headers: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(per row its headers encoded end to end, count per row)."""
    counts = np.diff(_offsets(headers)).astype(np.int64)
    counts[~valid(headers)] = 0  # a null row's offsets may span entries; flatten() leaves those out
    entries = call_function("list_flatten", [headers])  # ListArray.flatten() would import pyarrow.compute
    keys, values = as_binary(entries.field("key")), as_binary(entries.field("value"))
    if keys.null_count:
        raise ValueError("a header has a null key")
    encoded = _join(_varint_column(_lengths(keys)), keys, _varint_column(_lengths(values)), values)
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    rows = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
                                    encoded)
    nothing = _NOTHING_LARGE if pa.types.is_large_binary(encoded.type) else _NOTHING
    return call_function("binary_join", [rows, nothing]), counts


@dataclass(frozen=True)
class _Rows:
    """The columns as the encoder joins them, with each row's lengths: computed once for all of a set's batches."""

    values: pa.Array
    keys: pa.Array | None  # None: every key is null
    headers: pa.Array | None  # per row its headers encoded end to end (null: none); None: no header column
    value_lengths: np.ndarray
    key_lengths: np.ndarray
    header_counts: np.ndarray
    header_lengths: np.ndarray

    @classmethod
    def of(cls, columns: Columns) -> _Rows:
        n = len(columns)
        values = as_binary(columns.values)
        keys = as_binary(columns.keys) if columns.keys is not None else None
        if columns.headers is not None:
            headers, counts = _header_sections(columns.headers)
            header_lengths = _lengths(headers).clip(0)
        else:
            headers, counts, header_lengths = None, np.zeros(n, np.int64), np.zeros(n, np.int64)
        key_lengths = _lengths(keys) if keys is not None else np.full(n, -1, np.int64)
        return cls(values, keys, headers, _lengths(values), key_lengths, counts, header_lengths)

    def sizes(self) -> np.ndarray:
        """Each record's encoded size at most, bar its offset delta's varint."""
        return self.value_lengths.clip(0) + self.key_lengths.clip(0) + self.header_lengths + _RECORD_MOST


def _records(rows: _Rows, starts: np.ndarray, counts: np.ndarray) -> tuple[memoryview, np.ndarray]:
    """Every row's record, each batch's rows (from `starts`, `counts` of them) with offset deltas from 0; returns
    the records end to end and where each row's begins (n + 1 offsets). Without headers, every batch's records
    lack their last header count (0, one byte).

    A record is: length | attributes 0 | timestamp delta 0 | offset delta | key length | key | value length |
    value | header count | headers. Arrow's join lays the records out from as few pieces per row as there can
    be, its cost being per piece: everything before the value is one piece (a head), built for all rows at once
    in numpy (`_varint_rows`), unless a key is longer than `_SHORT_KEY` (then the head ends before the key, and
    the key and the value length are pieces of their own); without headers a record's header count (0) goes at
    the start of the next record's head."""
    n = len(rows.values)
    delta = _Varints(np.arange(n, dtype=np.int64) - np.repeat(starts, counts))
    key_length, value_length = _Varints(rows.key_lengths), _Varints(rows.value_lengths)
    if rows.headers is None:
        count, after = None, 1  # the header count, 0: one byte
    else:
        count = _Varints(rows.header_counts)
        after = count.widths + rows.header_lengths
    length = _Varints(2 + delta.widths + key_length.widths + rows.key_lengths.clip(0) + value_length.widths
                      + rows.value_lengths.clip(0) + after)
    head = [length, b"\0\0", delta, key_length]
    short_keys = rows.keys is None or not len(rows.key_lengths) or rows.key_lengths.max() <= _SHORT_KEY
    if rows.keys is not None and short_keys:
        head.append(_Short(rows.keys, rows.key_lengths))
    if short_keys:
        head.append(value_length)
    if count is None:
        head.insert(0, b"\0")  # the previous record's header count
    pieces = [_binary(*_varint_rows(head, n, None if count is not None else starts), n)]
    if not short_keys:
        pieces += [rows.keys, _binary(*_varint_rows([value_length], n), n)]
    pieces.append(rows.values)
    if count is not None:
        pieces += [_binary(*_varint_rows([count], n), n), rows.headers]
    records = _join(*pieces)
    _, offsets, data = records.buffers()
    wide = pa.types.is_large_binary(records.type)
    starts = np.frombuffer(offsets, np.int64 if wide else np.int32)
    return memoryview(data), starts[records.offset:records.offset + n + 1]


def _seal(out: bytearray, n: int, *, timestamp: int, producer_id: int = -1, producer_epoch: int = -1,
          base_sequence: int = -1, transactional: bool = False) -> Batch:
    """`out` (a v2 batch's header room, then its `n` records) with the header and its CRC written: an
    uncompressed batch, all of whose records have `timestamp` (CreateTime, ms)."""
    HEADER.pack_into(out, 0, 0, len(out) - LOG_OVERHEAD, -1, 2, 0, TRANSACTIONAL_BIT if transactional else 0,
                     n - 1, timestamp, timestamp, producer_id, producer_epoch, base_sequence, n)
    _CRC.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START:]))
    return Batch(out, n)


def _cuts(ends: np.ndarray, sets: list[tuple[int, int, int]], max_bytes: int) -> list[tuple[int, int, int, int]]:
    """(set, start, stop, base sequence) of each batch of the sets' rows, `ends` being the rows' cumulative sizes
    at most (`_Rows.sizes`, plus an offset delta's varint)."""
    cuts = []
    for index, (start, stop, sequence) in enumerate(sets):
        first = start
        while start < stop:
            limit = (ends[start - 1] if start else 0) + max_bytes - HEADER_SIZE
            end = min(max(int(np.searchsorted(ends, limit, "right")), start + 1), stop)
            # sequences wrap after Int32 max, as Kafka's
            cuts.append((index, start, end, -1 if sequence < 0 else (sequence + start - first) % 2**31))
            start = end
    return cuts


def encode_sets(columns: Columns, sets: list[tuple[int, int, int]], *, max_bytes: int, **header) -> list[list[Batch]]:
    """The rows of each set [start, stop) of `columns` (consecutive sets that cover them all: a partition's rows
    each) as consecutive uncompressed batches of at most `max_bytes` each (a record larger than that goes
    alone), their sequence numbers following on from the set's `sequence` unless it is -1 (no producer id).
    `header`: the batch header's timestamp (every record's, CreateTime ms), producer_id, producer_epoch,
    transactional. All sets' records are laid out at once: numpy's and Arrow's cost per call, not per row, is
    paid once per call, not per partition."""
    rows = _Rows.of(columns)
    cuts = _cuts(np.cumsum(rows.sizes() + _VARINT_BYTES), sets, max_bytes)
    if not cuts:
        return [[] for _ in sets]
    starts = np.array([cut[1] for cut in cuts], np.int64)
    counts = np.array([cut[2] - cut[1] for cut in cuts], np.int64)
    records, offsets = _records(rows, starts, counts)
    tail = int(rows.headers is None)
    out: list[list[Batch]] = [[] for _ in sets]
    for index, start, stop, sequence in cuts:
        first, last = int(offsets[start]), int(offsets[stop])
        data = bytearray(HEADER_SIZE + last - first + tail)
        data[HEADER_SIZE:HEADER_SIZE + last - first] = records[first:last]
        out[index].append(_seal(data, stop - start, base_sequence=sequence, **header))
    return out


def encode_batches(columns: Columns, *, max_bytes: int, sequence: int = -1, **header) -> list[Batch]:
    """`columns` as consecutive batches of one partition (`encode_sets`)."""
    return encode_sets(columns, [(0, len(columns), sequence)], max_bytes=max_bytes, **header)[0]


_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)


def murmur2_partitions(keys: pa.Array, partitions: int) -> np.ndarray:
    """Kafka's default partition of each key (Java's `Utils.murmur2` made positive, modulo the partition
    count; librdkafka's `murmur2` partitioner); -1 for a null key. Keys of one length are hashed together,
    a 4-byte word of every key at a time, so the Python loop is over key lengths and words, not rows."""
    keys = as_binary(keys)
    lengths = _lengths(keys)
    present = lengths >= 0
    starts = _offsets(keys)[:-1].astype(np.int64)
    data = np.frombuffer(keys.buffers()[2], np.uint8) if keys.buffers()[2] is not None else np.empty(0, np.uint8)
    # Every little-endian 4-byte word of the data, one starting at each byte: a word of each key is one gather.
    words_at = np.ndarray((max(len(data) - 3, 0),), "<u4", data, 0, (1,))
    result = np.full(len(keys), -1, np.int64)
    by_length = np.bincount(lengths[present], minlength=1)
    with np.errstate(over="ignore"):
        for length in np.flatnonzero(by_length).tolist():  # no sort, as unique() has
            rows = np.flatnonzero(lengths == length) if by_length[length] < len(keys) else slice(None)
            at = starts[rows]
            h = np.full(len(at), _SEED ^ np.uint32(length), np.uint32)
            words = length // 4
            for i in range(words):
                w = words_at[at + 4 * i] * _M
                w ^= w >> np.uint32(24)
                w *= _M
                h *= _M
                h ^= w
            tail = length % 4
            for j in range(tail - 1, -1, -1):
                h ^= data[at + (words * 4 + j)].astype(np.uint32) << np.uint32(8 * j)
            if tail:
                h *= _M
            h ^= h >> np.uint32(13)
            h *= _M
            h ^= h >> np.uint32(15)
            result[rows] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return result


# numba's encoder (kernels.py) takes over from numpy's once the process has decided to load it (compiled.py: the
# numpy paths, this encoder's and the source's walker, have cost it numba's load); this is the estimate numpy's CPU
# is charged against.
_KERNEL_SECONDS_PER_RECORD = 0.12e-6  # the compiled encode_partitioned, 100-byte records (numpy's: 0.35)


def encode_partitioned(columns: Columns, partitions: np.ndarray, count: int, spare: int, sequences, *,
                       max_bytes: int, **header) -> tuple[np.ndarray, list[tuple[int, list[Batch]]]]:
    """The rows of `columns` each to its partition of `count` in `partitions` (-1: its key's murmur2 partition, or
    `spare` for a null key), encoded per partition as `encode_sets` does, sequence numbers from `sequences[p]`.
    Returns each row's partition and each partition's batches, partitions in order. With numpy (`_numpy_sets`)
    or, once that has cost the process enough, numba (`_compiled_sets`): the same bytes."""
    partitions = partitions.astype(np.int64, copy=False)
    if partitions.max(initial=0) >= count:
        raise ValueError(f"{count} partitions; a row names partition {partitions.max()}")
    kernels = compiled.kernels()
    if kernels is not None:
        return _compiled_sets(kernels, columns, partitions, count, spare, sequences, max_bytes, header)
    started = time.thread_time()
    result = _numpy_sets(columns, partitions, count, spare, sequences, max_bytes, header)
    compiled.charge(time.thread_time() - started - _KERNEL_SECONDS_PER_RECORD * len(columns))
    return result


def _numpy_sets(columns: Columns, partitions: np.ndarray, count: int, spare: int, sequences, max_bytes: int,
                header: dict) -> tuple[np.ndarray, list[tuple[int, list[Batch]]]]:
    unset = partitions < 0
    if unset.any():
        partitions = partitions.copy()
        by_key = murmur2_partitions(columns.keys, count) if columns.keys is not None else np.full(len(columns), -1)
        partitions[unset] = by_key[unset]
        partitions[partitions < 0] = spare
    if not len(partitions):
        return partitions, []
    # numpy's stable sort of 16-bit integers is a radix sort: a fifth of the time of int64's merge sort.
    order = np.argsort(partitions.astype(np.int16) if count <= 2**15 else partitions, kind="stable")
    ordered = columns if (np.diff(order) == 1).all() else columns.take(order)  # each partition's rows together
    bounds = np.flatnonzero(np.diff(partitions[order])) + 1
    sets = [(int(start), int(stop), int(partitions[order[start]]))
            for start, stop in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(order)]]))]
    encoded = encode_sets(ordered, [(start, stop, sequences[p]) for start, stop, p in sets], max_bytes=max_bytes,
                          **header)
    return partitions, [(p, batches) for (_, _, p), batches in zip(sets, encoded)]


_NO_BYTES = np.frombuffer(b"\0", np.uint8)


def _bytes(column: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A binary column's data and where each row's bytes start in it (nothing for no column). Of one type
    whatever the column's (read-only bytes, int64 starts): numba compiles a kernel for each combination of its
    arguments' types, seconds each time a worker meets a new one."""
    if column is None:
        return _NO_BYTES, np.zeros(n, np.int64)
    data = column.buffers()[2]
    if data is None or not data.size:
        return _NO_BYTES, _offsets(column)[:-1].astype(np.int64)
    view = np.frombuffer(data, np.uint8)  # writable or not as Arrow's buffer is: a view that is not
    view.flags.writeable = False
    return view, _offsets(column)[:-1].astype(np.int64)


_SCRATCH_KEPT = 8 << 20  # the layout's buffer kept between sends (a Spark batch of 10,000 100-byte rows: 1.3 MB)
_scratch_buffer = np.empty(0, np.uint8)


def _scratch(size: int) -> np.ndarray:
    """A buffer of at least `size` bytes for the compiled layout, which each batch is copied out of: kept between
    sends, as a fresh one costs a page fault per 4 KiB once glibc hands large blocks back to the kernel (half of
    the compiled encoder's CPU in runs where it did)."""
    global _scratch_buffer
    if size <= len(_scratch_buffer):
        return _scratch_buffer
    if size > _SCRATCH_KEPT:
        return np.empty(size, np.uint8)
    _scratch_buffer = np.empty(max(size, min(2 * len(_scratch_buffer), _SCRATCH_KEPT)), np.uint8)
    return _scratch_buffer


def _compiled_sets(kernels, columns: Columns, partitions: np.ndarray, count: int, spare: int, sequences,
                   max_bytes: int, header: dict) -> tuple[np.ndarray, list[tuple[int, list[Batch]]]]:
    """`_numpy_sets` in numba: the partitions by key, the rows' order by partition and their records laid out in
    one pass each; the batches' cuts, headers and CRCs as numpy's."""
    rows = _Rows.of(columns)
    n = len(columns)
    partitions = np.array(partitions, np.int64)  # writable (one type for numba), and not the caller's
    keys, key_offsets = _bytes(rows.keys, n)
    if (partitions < 0).any():
        partitions = kernels.partitions_of(partitions, keys, key_offsets, rows.key_lengths, count, spare)
    order, sizes = kernels.partition_order(partitions, count)
    sets, start = [], 0
    for p in np.flatnonzero(sizes).tolist():
        sets.append((start, start + int(sizes[p]), p))
        start += int(sizes[p])
    ends = np.cumsum(rows.sizes()[order] + _VARINT_BYTES)
    cuts = _cuts(ends, [(a, b, sequences[p]) for a, b, p in sets], max_bytes)
    if not cuts:
        return partitions, []
    values, value_offsets = _bytes(rows.values, n)
    headers, header_offsets = _bytes(rows.headers, n)
    out = _scratch(int(ends[-1]) + HEADER_SIZE * len(cuts))
    bounds = kernels.lay_out(out, order, np.array([cut[1] for cut in cuts], np.int64),
                             np.array([cut[2] - cut[1] for cut in cuts], np.int64), keys, key_offsets, rows.key_lengths,
                             values, value_offsets, rows.value_lengths, headers, header_offsets, rows.header_lengths,
                             rows.header_counts)
    encoded: list[list[Batch]] = [[] for _ in sets]
    view = memoryview(out)
    for b, (index, start, stop, sequence) in enumerate(cuts):
        data = bytearray(view[bounds[b]:bounds[b + 1]])
        encoded[index].append(_seal(data, stop - start, base_sequence=sequence, **header))
    return partitions, [(p, batches) for (_, _, p), batches in zip(sets, encoded)]


def _one(kind, data: bytes) -> pa.Array:
    """A one-row array of `data` built from buffers: `pa.array` of Python objects imports pandas (0.3-0.4 s of a
    Spark Python worker's CPU, which the switch to numba would otherwise pay on top of numba's own load)."""
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(np.array([0, len(data)], np.int32)), pa.py_buffer(data)])


def _first_calls(kernels) -> None:
    """The encoder's loops called once each with the types a send passes them (compiled.py)."""
    entries = pa.StructArray.from_arrays([_one(pa.string(), b"h"), _one(pa.binary(), b"v")], ["key", "value"])
    headers = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), 2, [None, pa.py_buffer(np.array([0, 1],
                                                                                                       np.int32))]),
                                       entries)
    _compiled_sets(kernels, Columns(_one(pa.binary(), b"v"), _one(pa.binary(), b"k"), headers),
                   np.full(1, -1, np.int64), 1, 0, {0: 0}, 1 << 20, {"timestamp": 0})


compiled.warm_up(_first_calls)
