"""Fetched v2 record batches to Arrow columns, with no Python object per record.

The source's read tasks used to take one confluent-kafka Message per record and build the Arrow columns
from Python lists: 1.5-4.4 us of a Spark worker's CPU per 100-byte record over what Spark's Python data
source exchange costs (docs/performance.md, Spark section). Here a Fetch response's record set is walked
by two numba-compiled loops, batch headers first (the reader decides in Python, per batch, what to skip:
control batches, aborted transactions, offsets outside the range), then the records of the kept batches
into numpy arrays (offset, timestamp, where each key, value and header list starts and how long it is);
keys and values are then gathered into contiguous Arrow binary buffers. The varint walk is serial, which
is why it is compiled (numba, cached on disk: a worker pays its load once, not a compilation).

Record layout (records.py has the slow, object-per-record path the broker uses): length varint |
attributes i8 | timestamp_delta varlong | offset_delta varint | key_length varint | key |
value_length varint | value | header_count varint | (key_length varint | key | value_length varint | value)*
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pyarrow as pa

from ..errors import ErrorCode, KafkaError
from ..records.batch import COMPRESSION_MASK, CONTROL_BIT, HEADER_SIZE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, \
    read_header
from ..records.compression import NONE, decompress
from ..records.control import parse_control_batch

__all__ = ["FetchedColumns", "decode_record_set"]

# Rows of `_scan_batches`' answer, one column per whole batch (contiguous rows: what numba compiled for).
_POS, _SIZE, _BASE, _ATTRIBUTES, _LAST_DELTA, _FIRST_TS, _MAX_TS, _PRODUCER, _COUNT, _MAGIC = range(10)
# Rows of `_walk_records`' answer, one column per record.
_OFFSET, _TIMESTAMP, _KEY_POS, _KEY_LEN, _VALUE_POS, _VALUE_LEN, _HEADERS_POS, _HEADER_COUNT, _END = range(9)
_CORRUPT = -1


@numba.njit(cache=True, inline="always")
def _big_endian(buf, position, width):
    value = np.int64(0)
    for i in range(width):
        value = (value << 8) | np.int64(buf[position + i])
    if width == 4 and value >= 2**31:
        value -= 2**32
    elif width == 2 and value >= 2**15:
        value -= 2**16
    return value


@numba.njit(cache=True)
def _scan_batches(buf):
    """The header fields of every whole batch in a record set; a torn last batch (a Fetch answer cut at
    its byte limit) is left out, as Kafka's consumers do."""
    end = len(buf)
    count = 0
    position = 0
    while end - position >= HEADER_SIZE:
        size = _big_endian(buf, position + 8, 4) + 12
        if size < HEADER_SIZE or position + size > end:
            break
        count += 1
        position += size
    out = np.empty((10, count), np.int64)
    position = 0
    for row in range(count):
        out[_POS, row] = position
        out[_SIZE, row] = _big_endian(buf, position + 8, 4) + 12
        out[_BASE, row] = _big_endian(buf, position, 8)
        out[_MAGIC, row] = buf[position + 16]
        out[_ATTRIBUTES, row] = _big_endian(buf, position + 21, 2)
        out[_LAST_DELTA, row] = _big_endian(buf, position + 23, 4)
        out[_FIRST_TS, row] = _big_endian(buf, position + 27, 8)
        out[_MAX_TS, row] = _big_endian(buf, position + 35, 8)
        out[_PRODUCER, row] = _big_endian(buf, position + 43, 8)
        out[_COUNT, row] = _big_endian(buf, position + 57, 4)
        position += out[_SIZE, row]
    return out


@numba.njit(cache=True, inline="always")
def _varint(buf, position, end):
    """A zigzag varint at `position`: (value, next position), or (0, -1) when it runs past `end`."""
    raw = np.int64(0)
    shift = 0
    while True:
        if position >= end or shift > 63:
            return np.int64(0), np.int64(-1)
        byte = np.int64(buf[position])
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    return ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1), np.int64(position)


@numba.njit(cache=True)
def _walk_records(buf, starts, ends, counts, base_offsets, first_timestamps, max_timestamps, log_append):
    """One column per record of the batches whose records section is buf[starts[i]:ends[i]]; None when a
    record is malformed (a length running past its record or batch, bytes left over)."""
    out = np.empty((9, counts.sum()), np.int64)
    row = 0
    for b in range(len(starts)):
        position, end = np.int64(starts[b]), np.int64(ends[b])
        for _ in range(counts[b]):
            length, position = _varint(buf, position, end)
            if position < 0 or length < 1 or position + length > end:
                return None
            record_end = position + length
            timestamp_delta, position = _varint(buf, position + 1, record_end)  # + 1: attributes
            if position < 0:
                return None
            offset_delta, position = _varint(buf, position, record_end)
            if position < 0:
                return None
            key_length, position = _varint(buf, position, record_end)
            if position < 0 or position + max(key_length, 0) > record_end:
                return None
            out[_KEY_POS, row], out[_KEY_LEN, row] = position, key_length
            value_length, position = _varint(buf, position + max(key_length, 0), record_end)
            if position < 0 or position + max(value_length, 0) > record_end:
                return None
            out[_VALUE_POS, row], out[_VALUE_LEN, row] = position, value_length
            header_count, position = _varint(buf, position + max(value_length, 0), record_end)
            if position < 0 or header_count < 0 or (header_count == 0 and position != record_end):
                return None
            out[_HEADERS_POS, row], out[_HEADER_COUNT, row], out[_END, row] = position, header_count, record_end
            out[_OFFSET, row] = base_offsets[b] + offset_delta
            out[_TIMESTAMP, row] = max_timestamps[b] if log_append[b] else first_timestamps[b] + timestamp_delta
            row += 1
            position = record_end
        if position != end:
            return None
    return out


@numba.njit(cache=True)
def _walk_headers(buf, positions, counts, ends):
    """(key pos, key length, value pos, value length) of every header of the records whose header lists
    start at `positions` and end at `ends`; None when one is malformed or has a null key."""
    out = np.empty((4, counts.sum()), np.int64)
    row = 0
    for r in range(len(positions)):
        position, end = np.int64(positions[r]), np.int64(ends[r])
        for _ in range(counts[r]):
            for field in range(2):
                length, position = _varint(buf, position, end)
                if position < 0 or position + max(length, 0) > end or (field == 0 and length < 0):
                    return None
                out[2 * field, row], out[2 * field + 1, row] = position, length
                position += max(length, 0)
            row += 1
        if position != end:
            return None
    return out


@numba.njit(cache=True)
def _gather(buf, positions, lengths):
    """Arrow offsets (int32) and data of the byte strings buf[positions[i]:+lengths[i]] (null: -1)."""
    offsets = np.empty(len(positions) + 1, np.int32)
    total = 0
    for i in range(len(positions)):
        offsets[i] = total
        total += max(lengths[i], 0)
    offsets[len(positions)] = total
    data = np.empty(total, np.uint8)
    for i in range(len(positions)):
        data[offsets[i]:offsets[i + 1]] = buf[positions[i]:positions[i] + max(lengths[i], 0)]
    return offsets, data


@dataclass
class FetchedColumns:
    """The records of a record set in [start, end), column-wise; `next_offset`: where the next Fetch
    starts (after the last whole batch, skipped ones included), `start` when there was none."""

    offsets: np.ndarray
    timestamps: np.ndarray  # ms
    log_append_time: np.ndarray  # bool
    keys: pa.Array
    values: pa.Array
    headers: pa.Array | None
    next_offset: int

    def __len__(self) -> int:
        return len(self.offsets)


def decode_record_set(records, start: int, end: int, aborted: list[tuple[int, int]] | None,
                      headers_type: pa.DataType | None = None) -> FetchedColumns:
    """The records of a Fetch answer's record set at offsets [start, end). Control batches are skipped;
    with `aborted` (read_committed: the answer's (producer id, first offset) list) so are the batches of
    aborted transactions. `headers_type`: build the headers column with it (else none)."""
    buf = np.frombuffer(records, np.uint8)
    batches = _scan_batches(buf)
    if not batches.shape[1]:
        return _empty(start, headers_type)
    if (batches[_MAGIC] != 2).any():
        raise KafkaError(ErrorCode.corrupt_message, "the Spark source reads record batches v2 only")
    last_offsets = batches[_BASE] + batches[_LAST_DELTA]
    next_offset = max(start, int(last_offsets[-1]) + 1)
    attributes = batches[_ATTRIBUTES]
    keep = ((attributes & CONTROL_BIT) == 0) & (last_offsets >= start) & (batches[_BASE] < end)
    if aborted:
        keep &= ~_aborted(records, batches, last_offsets, aborted)
    if not keep.any():
        return _empty(next_offset, headers_type)
    batches = np.ascontiguousarray(batches[:, keep])  # one layout: numba compiles one version per layout
    starts, ends = batches[_POS] + HEADER_SIZE, batches[_POS] + batches[_SIZE]
    codecs = batches[_ATTRIBUTES] & COMPRESSION_MASK
    if codecs.any():
        buf, starts, ends = _inflated(records, starts, ends, codecs)
    log_append = (batches[_ATTRIBUTES] & TIMESTAMP_TYPE_BIT) != 0
    rows = _walk_records(buf, starts, ends, batches[_COUNT], batches[_BASE], batches[_FIRST_TS], batches[_MAX_TS],
                         log_append)
    if rows is None:
        raise KafkaError(ErrorCode.corrupt_message, f"malformed record in a batch at offsets {start}..{end}")
    log_append = np.repeat(log_append, batches[_COUNT])
    if not rows.shape[1]:  # batches emptied by compaction
        return _empty(next_offset, headers_type)
    if rows[_OFFSET, 0] < start or rows[_OFFSET, -1] >= end:  # only the first and last batch can cross the range
        inside = (rows[_OFFSET] >= start) & (rows[_OFFSET] < end)
        rows, log_append = rows[:, inside].copy(), log_append[inside]
    return FetchedColumns(
        offsets=rows[_OFFSET],
        timestamps=rows[_TIMESTAMP],
        log_append_time=log_append,
        keys=_binary(buf, rows[_KEY_POS], rows[_KEY_LEN], pa.binary()),
        values=_binary(buf, rows[_VALUE_POS], rows[_VALUE_LEN], pa.binary()),
        headers=None if headers_type is None else _headers(buf, rows, headers_type),
        next_offset=next_offset,
    )


def _aborted(records, batches, last_offsets, aborted: list[tuple[int, int]]) -> np.ndarray:
    """Batches of aborted transactions, as Kafka's consumer finds them: a producer's transactional batches
    from its aborted transaction's first offset on, until that producer's ABORT marker."""
    pending = sorted(aborted, key=lambda txn: txn[1], reverse=True)
    aborting: set[int] = set()
    out = np.zeros(batches.shape[1], bool)
    for i, producer_id in enumerate(batches[_PRODUCER].tolist()):
        if producer_id < 0:
            continue
        while pending and pending[-1][1] <= last_offsets[i]:
            aborting.add(pending.pop()[0])
        attributes = int(batches[_ATTRIBUTES, i])
        if attributes & CONTROL_BIT:
            marker = parse_control_batch(records, read_header(records, int(batches[_POS, i])))
            if marker is not None and not marker.commit:
                aborting.discard(producer_id)
        elif attributes & TRANSACTIONAL_BIT and producer_id in aborting:
            out[i] = True
    return out


def _inflated(records, starts, ends, codecs):
    """One buffer holding every kept batch's records section, the compressed ones decompressed."""
    with memoryview(records) as view:
        sections = [view[s:e] if codec == NONE else decompress(codec, view[s:e])
                    for s, e, codec in zip(starts.tolist(), ends.tolist(), codecs.tolist())]
        lengths = np.fromiter(map(len, sections), np.int64, len(sections))
        joined = b"".join(sections)
        del sections
    ends = np.cumsum(lengths)
    return np.frombuffer(joined, np.uint8), ends - lengths, ends


def _binary(buf, positions, lengths, kind: pa.DataType) -> pa.Array:
    offsets, data = _gather(buf, positions, lengths)
    valid = lengths >= 0
    nulls = len(valid) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(kind, len(positions), [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def _headers(buf, rows, headers_type: pa.DataType) -> pa.Array:
    counts = rows[_HEADER_COUNT]
    headers = _walk_headers(buf, rows[_HEADERS_POS], counts, rows[_END])
    if headers is None:
        raise KafkaError(ErrorCode.corrupt_message, "malformed record header")
    entry = headers_type.value_type
    keys = _binary(buf, headers[0], headers[1], entry.field("key").type)
    try:
        keys.validate(full=True)  # header keys are UTF-8 strings
    except pa.ArrowInvalid as exc:
        raise KafkaError(ErrorCode.corrupt_message, f"record header key: {exc}") from None
    values = _binary(buf, headers[2], headers[3], entry.field("value").type)
    struct = pa.StructArray.from_arrays([keys, values], fields=list(entry))
    list_offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    return pa.ListArray.from_arrays(pa.array(list_offsets), struct, type=headers_type)


def _empty(next_offset: int, headers_type: pa.DataType | None) -> FetchedColumns:
    nothing = np.empty(0, np.int64)
    return FetchedColumns(nothing, nothing, np.empty(0, bool), pa.array([], pa.binary()), pa.array([], pa.binary()),
                          None if headers_type is None else pa.array([], headers_type), next_offset)
