"""Record batches (magic v2) encoded straight from Arrow columns, and Kafka's murmur2 partitioner over them.

The sink's per-record cost was a Python call per row into confluent-kafka (issue 16). Here no Python runs
per record: a record's fields are varints of lengths and deltas, computed for all rows at once with numpy;
Arrow's `binary_join_element_wise` then lays out, row by row in C++, the varints, key, value and headers of
each record end to end, which is the batch's records section. A header costs the same way (its varints,
key and value joined, then a row's headers joined by `binary_join`).

Record layout (records.py): length | attributes 0 | timestamp delta | offset delta | key length | key |
value length | value | header count | (key length | key | value length | value)* ; varints zigzag-encoded,
-1 for a null key, value or header value.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..records.batch import CRC_OFFSET, CRC_START, HEADER, HEADER_SIZE, LOG_OVERHEAD, TRANSACTIONAL_BIT
from ..records.crc import crc32c

__all__ = ["Batch", "Columns", "encode_batches", "murmur2_partitions"]

_VARINT_BYTES = 5  # lengths and deltas are 32-bit: a zigzag varint of one takes at most 5 bytes
_SHIFTS = np.arange(_VARINT_BYTES, dtype=np.uint64) * np.uint64(7)
_BOUNDS = np.uint64(1) << _SHIFTS[1:]  # a value at or above bound k needs more than k bytes
_CRC = struct.Struct(">I")
_NOTHING = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, np.int32)), pa.py_buffer(b"")])[0]
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
        return Columns(*(None if c is None else c.take(pick) for c in (self.values, self.keys, self.headers)))

    def slice(self, start: int, stop: int) -> Columns:
        return Columns(*(None if c is None else c.slice(start, stop - start)
                         for c in (self.values, self.keys, self.headers)))


@dataclass(frozen=True)
class Batch:
    """One encoded batch and how many records (sequence numbers) it holds."""

    data: bytes
    records: int


def _sizes(zigzag: np.ndarray) -> np.ndarray:
    sizes = np.ones(zigzag.shape, np.uint8)
    for bound in _BOUNDS:  # one pass per bound: a reduction over a short last axis is numpy's slow case
        sizes += zigzag >= bound
    return sizes


def _zigzag(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints of 2-d int64 `values` end to end in row-major order (uint8), and the bytes per row.
    Each pass writes one byte of every varint that has one there: most have one or two."""
    rows, columns = values.shape
    zigzag = _zigzag(values).ravel()
    if not len(zigzag) or zigzag.max() < 0x80:  # one byte each: the varint is the value
        return zigzag.astype(np.uint8), np.full(rows, columns, np.int64)
    sizes = _sizes(zigzag)
    ends = np.cumsum(sizes, dtype=np.int64)
    position = ends - sizes
    out = np.empty(int(ends[-1]) if len(ends) else 0, np.uint8)
    while len(zigzag):
        more = sizes > 1
        out[position] = (zigzag & np.uint64(0x7F)).astype(np.uint8) | (more.view(np.uint8) << np.uint8(7))
        zigzag, sizes, position = zigzag[more] >> np.uint64(7), sizes[more] - 1, position[more] + 1
    per_row = ends[columns - 1::columns] - np.concatenate([[0], ends[columns - 1:-1:columns]]) if rows else ends
    return out, per_row


def _binary(stream: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """A binary array over `stream` cut into pieces of `sizes` bytes (no copy)."""
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(stream)])


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


def _join(*columns: pa.Array) -> pa.Array:
    """Row by row, the columns' bytes end to end; a null adds nothing (its length field says -1)."""
    return pc.binary_join_element_wise(*columns, _NOTHING, null_handling="replace", null_replacement=b"")


def _header_sections(headers: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(per row its headers encoded end to end, count per row)."""
    counts = np.diff(_offsets(headers)).astype(np.int64)
    counts[~valid(headers)] = 0  # a null row's offsets may span entries; flatten() leaves those out
    entries = headers.flatten()
    keys, values = as_binary(entries.field("key")), as_binary(entries.field("value"))
    if keys.null_count:
        raise ValueError("a header has a null key")
    encoded = _join(_varint_column(_lengths(keys))[0], keys, _varint_column(_lengths(values))[0], values)
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    rows = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
                                    encoded)
    return pc.binary_join(rows, _NOTHING), counts


@dataclass(frozen=True)
class _Rows:
    """The columns as the encoder joins them, with each row's lengths: computed once for all of a set's batches."""

    values: pa.Array
    keys: pa.Array
    headers: pa.Array  # per row its headers encoded end to end (null: none)
    value_lengths: np.ndarray
    key_lengths: np.ndarray
    header_counts: np.ndarray
    header_lengths: np.ndarray

    @classmethod
    def of(cls, columns: Columns) -> _Rows:
        n = len(columns)
        values = as_binary(columns.values)
        keys = as_binary(columns.keys) if columns.keys is not None else pa.nulls(n, pa.binary())
        if columns.headers is not None:
            headers, counts = _header_sections(columns.headers)
        else:
            headers, counts = pa.nulls(n, pa.binary()), np.zeros(n, np.int64)
        return cls(values, keys, headers, _lengths(values), _lengths(keys), counts, _lengths(headers).clip(0))

    def sizes(self) -> np.ndarray:
        """Each record's encoded size at most, bar its offset delta's varint."""
        return self.value_lengths.clip(0) + self.key_lengths.clip(0) + self.header_lengths + _RECORD_MOST


def _varint_column(values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The zigzag varint of each of `values` (1-d int64) as a binary array, and its size in bytes. When every
    varint has the same size (a column of 100-byte values, record lengths of one order) the bytes are laid
    out as an n x size matrix, one numpy pass per byte, with no scatter."""
    zigzag = _zigzag(values)
    sizes = _sizes(zigzag)
    width = int(sizes[0]) if len(sizes) else 1
    if not len(sizes) or (sizes == width).all():
        out = np.empty((len(values), width), np.uint8)
        for byte in range(width):
            part = (zigzag >> np.uint64(7 * byte)) & np.uint64(0x7F)
            out[:, byte] = part | np.uint64(0x80) if byte < width - 1 else part
        offsets = np.arange(0, (len(values) + 1) * width, width, dtype=np.int32)
        column = pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(out)])
        return column, sizes.astype(np.int64)
    stream, per_row = varints(values[:, None])
    return _binary(stream, per_row), per_row


_deltas: list = []  # [binary array of the varints of 0..n-1], grown on demand (`_offset_deltas`)


def _offset_deltas(n: int) -> tuple[pa.Array, np.ndarray]:
    """The varints of offset deltas 0..n-1 and their sizes: the same for every batch of n records or more,
    so computed once per process (and again only for a larger batch)."""
    if not _deltas or len(_deltas[0]) < n:
        _deltas[:] = _varint_column(np.arange(max(n, 4096), dtype=np.int64))
    column, sizes = _deltas
    return column.slice(0, n), sizes[:n]


# A record's attributes (0) and timestamp delta (0: the batch's timestamp). Built from buffers: pyarrow's
# conversion of a Python scalar imports pandas (see `numbers`).
_ZEROS = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([0, 2], np.int32)),
                                                pa.py_buffer(b"\x00\x00")])[0]


def _encode(rows: _Rows, start: int, stop: int, *, timestamp: int, producer_id: int = -1, producer_epoch: int = -1,
            base_sequence: int = -1, transactional: bool = False) -> bytes:
    """One uncompressed v2 batch of rows [start, stop), all with `timestamp` (CreateTime, ms)."""
    n = stop - start
    # Per record: length | attributes | timestamp delta | offset delta | key length | key | value length | value |
    # header count | headers. Each varint column is encoded on its own (`_varint_column`).
    key_lengths, value_lengths = rows.key_lengths[start:stop], rows.value_lengths[start:stop]
    deltas, delta_sizes = _offset_deltas(n)
    key_varints, key_sizes = _varint_column(key_lengths)
    value_varints, value_sizes = _varint_column(value_lengths)
    count_varints, count_sizes = _varint_column(rows.header_counts[start:stop])
    lengths = (2 + delta_sizes + key_sizes + key_lengths.clip(0) + value_sizes + value_lengths.clip(0) + count_sizes
               + rows.header_lengths[start:stop])
    records = _join(_varint_column(lengths)[0], _ZEROS, deltas, key_varints, rows.keys.slice(start, n),
                    value_varints, rows.values.slice(start, n), count_varints, rows.headers.slice(start, n))
    _, offsets, data = records.buffers()
    first, last = np.frombuffer(offsets, np.int32)[[records.offset, records.offset + n]]
    out = bytearray(HEADER_SIZE) + memoryview(data)[first:last]
    HEADER.pack_into(out, 0, 0, len(out) - LOG_OVERHEAD, -1, 2, 0, TRANSACTIONAL_BIT if transactional else 0,
                     n - 1, timestamp, timestamp, producer_id, producer_epoch, base_sequence, n)
    _CRC.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def encode_batches(columns: Columns, *, max_bytes: int, sequence: int = -1, **header) -> list[Batch]:
    """`columns` as consecutive uncompressed batches of at most `max_bytes` each (a record larger than that
    goes alone), their sequence numbers following on from `sequence` unless it is -1 (no producer id).
    `header`: the batch header's timestamp (every record's, CreateTime ms), producer_id, producer_epoch,
    transactional."""
    rows = _Rows.of(columns)
    ends = np.cumsum(rows.sizes() + _VARINT_BYTES)
    batches, start = [], 0
    while start < len(columns):
        limit = (ends[start - 1] if start else 0) + max_bytes - HEADER_SIZE
        stop = max(int(np.searchsorted(ends, limit, "right")), start + 1)
        first = -1 if sequence < 0 else (sequence + start) % 2**31  # sequences wrap after Int32 max, as Kafka's
        batches.append(Batch(_encode(rows, start, stop, base_sequence=first, **header), stop - start))
        start = stop
    return batches


_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)


def murmur2_partitions(keys: pa.Array, partitions: int) -> np.ndarray:
    """Kafka's default partition of each key (Java's `Utils.murmur2` made positive, modulo the partition
    count; librdkafka's `murmur2` partitioner); -1 for a null key. Keys of one length are hashed together,
    a column of bytes at a time, so the Python loop is over key lengths and 4-byte words, not rows."""
    keys = as_binary(keys)
    lengths = _lengths(keys)
    present = lengths >= 0
    starts = _offsets(keys)[:-1].astype(np.int64)
    data = np.frombuffer(keys.buffers()[2], np.uint8) if keys.buffers()[2] is not None else np.empty(0, np.uint8)
    result = np.full(len(keys), -1, np.int64)
    with np.errstate(over="ignore"):
        for length in np.unique(lengths[present]):
            rows = np.flatnonzero((lengths == length) & present)
            block = data[starts[rows, None] + np.arange(length)]
            h = np.full(len(rows), _SEED ^ np.uint32(length), np.uint32)
            words = length // 4
            k = block[:, :words * 4].copy().view("<u4")
            for i in range(words):
                w = k[:, i] * _M
                w ^= w >> np.uint32(24)
                w *= _M
                h *= _M
                h ^= w
            tail = length % 4
            for j in range(tail - 1, -1, -1):
                h ^= block[:, words * 4 + j].astype(np.uint32) << np.uint32(8 * j)
            if tail:
                h *= _M
            h ^= h >> np.uint32(13)
            h *= _M
            h ^= h >> np.uint32(15)
            result[rows] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return result
