"""The source's decoder loops without a compiler (columns.py): Python over batch headers and record
starts, numpy over everything else.

A record's length comes first, so where the next record starts is only known once this one's length is
read: that walk is serial and runs in Python, a few bytecodes per record (0.2-0.35 us). Every other field
(timestamp and offset deltas, key and value lengths, the header count) is then decoded for all records
at once, one vectorised varint read per field. About 0.4-0.5 us per 100-byte record in all, against
0.1-0.15 us for the numba loops (kernels.py), which take 0.4-0.5 s of CPU to load in each fresh Spark
Python worker: columns.py starts with these and moves to numba once a worker has decoded enough records
to pay for the load.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..records.batch import HEADER, HEADER_SIZE

# Rows of `scan_batches`' answer, one column per whole batch.
POS, SIZE, BASE, ATTRIBUTES, LAST_DELTA, FIRST_TS, MAX_TS, PRODUCER, COUNT, MAGIC = range(10)
# Rows of `walk_records`' answer, one column per record.
OFFSET, TIMESTAMP, KEY_POS, KEY_LEN, VALUE_POS, VALUE_LEN, HEADERS_POS, HEADER_COUNT, END = range(9)

_MAX_VARINT = 10  # bytes of a 64-bit varint
# The smallest record: its length, attributes, timestamp and offset deltas, key and value lengths (-1: null)
# and header count, one byte each.
MIN_RECORD_BYTES = 7


def scan_batches(buf: np.ndarray) -> np.ndarray:
    """The header fields of every whole batch in a record set; a torn last batch (a Fetch answer cut at
    its byte limit) is left out, as Kafka's consumers do."""
    rows, position, end = [], 0, len(buf)
    while end - position >= HEADER_SIZE:
        (base, length, _, magic, _, attributes, last_delta, first_ts, max_ts, producer, _, _,
         count) = HEADER.unpack_from(buf, position)
        size = length + 12
        if size < HEADER_SIZE or position + size > end:
            break
        rows.append((position, size, base, attributes, last_delta, first_ts, max_ts, producer, count, magic))
        position += size
    return np.array(rows, np.int64).reshape(-1, 10).T.copy()


def walk_records(buf: np.ndarray, starts, ends, counts, base_offsets, first_timestamps, max_timestamps,
                 log_append) -> np.ndarray | None:
    """One column per record of the batches whose records section is buf[starts[i]:ends[i]]; None when
    a record is malformed (a length running past its record or batch, bytes left over). The counts must
    fit their sections (`MIN_RECORD_BYTES` each): they bound the walk, even one a bad length sends back."""
    data = buf.tobytes()  # the walk indexes bytes: an int per index, no numpy scalar
    heads: list[int] = []
    try:
        for start, end, count in zip(starts.tolist(), ends.tolist(), counts.tolist()):
            if _record_heads(data, start, count, heads) != end:
                return None
    except IndexError:  # a length ran past the answer
        return None
    head = np.array(heads, np.int64)
    end = np.empty_like(head)  # each record's end: the next one's head, or its batch's end
    end[:-1] = head[1:]
    full = counts > 0
    end[np.cumsum(counts)[full] - 1] = ends[full]
    length, position, ok = varints(buf, head, end)
    ok &= length >= 1  # the walk went forward, so every record lies within its batch
    out = np.empty((9, len(head)), np.int64)
    out[END] = end
    timestamp_delta, position, good = varints(buf, position + 1, end)  # + 1: attributes
    ok &= good
    offset_delta, position, good = varints(buf, position, end)
    ok &= good
    for pos_row, len_row in ((KEY_POS, KEY_LEN), (VALUE_POS, VALUE_LEN)):
        length, position, good = varints(buf, position, end)
        after = position + np.maximum(length, 0)
        ok &= good & (after <= end)
        out[pos_row], out[len_row] = position, length
        position = after
    header_count, position, good = varints(buf, position, end)
    ok &= good & (header_count >= 0) & ((header_count != 0) | (position == end))
    if not ok.all():
        return None
    out[HEADERS_POS], out[HEADER_COUNT] = position, header_count
    batch_of = np.repeat(np.arange(len(counts)), counts)
    out[OFFSET] = base_offsets[batch_of] + offset_delta
    out[TIMESTAMP] = np.where(log_append[batch_of], max_timestamps[batch_of],
                              first_timestamps[batch_of] + timestamp_delta)
    return out


def _record_heads(data, position: int, count: int, heads: list) -> int:
    """Append where each of `count` records from `position` starts (its length varint); return the
    position after the last one. No bounds here: `walk_records` checks afterwards that the walk ended at
    its batch's end and that every length was at least 1 (so that it only went forward)."""
    append = heads.append
    for _ in range(count):
        append(position)
        raw = data[position]
        if raw < 0x80:
            position += 1 + ((raw >> 1) ^ -(raw & 1))
            continue
        second = data[position + 1]
        if second < 0x80:
            raw = (raw & 0x7F) | second << 7
            position += 2
        else:
            raw, position = _varint(data, position)
        position += (raw >> 1) ^ -(raw & 1)
    return position


def _varint(data, position: int) -> tuple[int, int]:
    """The raw (zigzag) varint at `position` and the position after it; at most ten bytes are read."""
    raw = 0
    for shift in range(0, 7 * _MAX_VARINT, 7):
        byte = data[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
    return raw, position


def varints(buf: np.ndarray, positions: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The zigzag varints at `positions` (one each), as int64: (values, the positions after them, whether
    each lay wholly before its `ends`). Most are one or two bytes: one pass per byte, over those still
    going."""
    ok = positions < ends
    first = buf[np.where(ok, positions, 0)].astype(np.int64)
    raw = first & 0x7F
    after = positions + 1
    going = np.flatnonzero(ok & (first >= 0x80))
    for shift in range(7, 7 * _MAX_VARINT, 7):
        if not going.size:
            break
        at = positions[going] + shift // 7
        inside = at < ends[going]
        ok[going[~inside]] = False
        going, at = going[inside], at[inside]
        byte = buf[at].astype(np.int64)
        raw[going] |= (byte & 0x7F) << shift
        after[going] = at + 1
        going = going[byte >= 0x80]
    ok[going] = False  # over ten bytes
    return ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1), after, ok


def walk_headers(buf: np.ndarray, positions, counts, ends) -> np.ndarray | None:
    """(key pos, key length, value pos, value length) of every header of the records whose header lists
    start at `positions` and end at `ends`; None when one is malformed or has a null key. One vectorised
    pass per header index (the first header of every record, then the second...)."""
    out = np.empty((4, int(counts.sum())), np.int64)
    rows = np.cumsum(counts) - counts  # each record's first header's row
    position = positions.copy()
    for index in range(int(counts.max(initial=0))):
        held = np.flatnonzero(counts > index)
        at, end = position[held], ends[held]
        for field in range(2):
            length, at, ok = varints(buf, at, end)
            if not (ok & (at + np.maximum(length, 0) <= end) & ((field == 1) | (length >= 0))).all():
                return None
            out[2 * field, rows[held] + index], out[2 * field + 1, rows[held] + index] = at, length
            at = at + np.maximum(length, 0)
        position[held] = at
    if (position != ends).any():
        return None
    return out


def binary_column(data: pa.Buffer, positions: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """An Arrow array of the byte strings data[positions[i]:+lengths[i]] (null: length -1), `positions`
    ascending and the strings apart. Taken from an array over `data` itself whose elements alternate
    between the strings and what lies between them: Arrow copies them out in one pass."""
    count = len(positions)
    if not count:
        return pa.array([], kind)
    large = len(data) >= 2**31
    bounds = np.empty(2 * count, np.int64 if large else np.int32)
    bounds[0::2] = positions
    bounds[1::2] = positions + np.maximum(lengths, 0)
    spans = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * count - 1,
                                  [None, pa.py_buffer(bounds), data])
    taken = spans.take(pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(np.arange(0, 2 * count, 2))]))
    if large:
        taken = taken.cast(pa.binary())
    valid = lengths >= 0
    nulls = count - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(kind, count, [bitmap, *taken.buffers()[1:]], nulls)
