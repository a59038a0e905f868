"""The compiled loops of the source's decoder (columns.py) and of the sink's encoder (record_batches.py):
numba, cached on disk. The decoder's give walk.py's answers, decoding at about 0.1 us per 100-byte record
instead of 0.2 (records of one size) to 0.6 (sizes that vary); the encoder's give record_batches' numpy
encoder's bytes, in one pass over the rows instead of a dozen numpy and Arrow passes.

Imported only once the numpy paths have cost a process enough CPU to pay for it: numba's import and its
first call in a process (the cached machine code loaded, numba's CPU target set up) cost 0.4-0.5 s of CPU
on a quiet machine, once per Spark Python worker, which a short job's first tasks would otherwise pay on
every fresh worker.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..records.batch import HEADER_SIZE
from .walk import (ATTRIBUTES, BASE, COUNT, END, FIRST_TS, HEADER_COUNT, HEADERS_POS, KEY_LEN, KEY_POS, LAST_DELTA,
                   MAGIC, MAX_TS, OFFSET, POS, PRODUCER, SIZE, TIMESTAMP, VALUE_LEN, VALUE_POS)


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
def scan_batches(buf):
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
        out[POS, row] = position
        out[SIZE, row] = _big_endian(buf, position + 8, 4) + 12
        out[BASE, row] = _big_endian(buf, position, 8)
        out[MAGIC, row] = buf[position + 16]
        out[ATTRIBUTES, row] = _big_endian(buf, position + 21, 2)
        out[LAST_DELTA, row] = _big_endian(buf, position + 23, 4)
        out[FIRST_TS, row] = _big_endian(buf, position + 27, 8)
        out[MAX_TS, row] = _big_endian(buf, position + 35, 8)
        out[PRODUCER, row] = _big_endian(buf, position + 43, 8)
        out[COUNT, row] = _big_endian(buf, position + 57, 4)
        position += out[SIZE, row]
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
def walk_records(buf, starts, ends, counts, base_offsets, first_timestamps, max_timestamps, log_append):
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
            out[KEY_POS, row], out[KEY_LEN, row] = position, key_length
            value_length, position = _varint(buf, position + max(key_length, 0), record_end)
            if position < 0 or position + max(value_length, 0) > record_end:
                return None
            out[VALUE_POS, row], out[VALUE_LEN, row] = position, value_length
            header_count, position = _varint(buf, position + max(value_length, 0), record_end)
            if position < 0 or header_count < 0 or (header_count == 0 and position != record_end):
                return None
            out[HEADERS_POS, row], out[HEADER_COUNT, row], out[END, row] = position, header_count, record_end
            out[OFFSET, row] = base_offsets[b] + offset_delta
            out[TIMESTAMP, row] = max_timestamps[b] if log_append[b] else first_timestamps[b] + timestamp_delta
            row += 1
            position = record_end
        if position != end:
            return None
    return out


@numba.njit(cache=True)
def walk_headers(buf, positions, counts, ends):
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



_M = np.uint64(0x5BD1E995)
_LOW = np.uint64(0xFFFFFFFF)


@numba.njit(cache=True)
def partitions_of(partitions, keys, key_offsets, key_lengths, count, spare):
    """`partitions` with each -1 replaced by its key's murmur2 partition (Kafka's, as
    record_batches.murmur2_partitions) or, for a null key, by `spare`."""
    out = partitions.copy()
    for row in range(len(out)):
        if out[row] >= 0:
            continue
        length = key_lengths[row]
        if length < 0:
            out[row] = spare
            continue
        start = np.int64(key_offsets[row])
        h = (np.uint64(0x9747B28C) ^ np.uint64(length)) & _LOW
        words = length // 4
        for i in range(words):
            at = start + 4 * i
            k = (np.uint64(keys[at]) | (np.uint64(keys[at + 1]) << np.uint64(8))
                 | (np.uint64(keys[at + 2]) << np.uint64(16)) | (np.uint64(keys[at + 3]) << np.uint64(24)))
            k = (k * _M) & _LOW
            k ^= k >> np.uint64(24)
            k = (k * _M) & _LOW
            h = ((h * _M) & _LOW) ^ k
        tail = length % 4
        at = start + 4 * words
        for j in range(tail - 1, -1, -1):
            h ^= np.uint64(keys[at + j]) << np.uint64(8 * j)
        if tail:
            h = (h * _M) & _LOW
        h ^= h >> np.uint64(13)
        h = (h * _M) & _LOW
        h ^= h >> np.uint64(15)
        out[row] = np.int64(h & np.uint64(0x7FFFFFFF)) % count
    return out


@numba.njit(cache=True)
def partition_order(partitions, count):
    """The rows in order of partition, each partition's in their own order (numpy's stable argsort's answer), and
    how many rows each partition has."""
    sizes = np.zeros(count, np.int64)
    for p in partitions:
        sizes[p] += 1
    at = np.empty(count, np.int64)
    total = 0
    for p in range(count):
        at[p] = total
        total += sizes[p]
    order = np.empty(len(partitions), np.int64)
    for row in range(len(partitions)):
        p = partitions[row]
        order[at[p]] = row
        at[p] += 1
    return order, sizes


@numba.njit(cache=True, inline="always")
def _varint_size(value):
    z = np.uint64((value << 1) ^ (value >> 63))
    size = 1
    while z >= 0x80:
        z >>= np.uint64(7)
        size += 1
    return size


@numba.njit(cache=True, inline="always")
def _put_varint(out, at, value):
    z = np.uint64((value << 1) ^ (value >> 63))
    while z >= 0x80:
        out[at] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        z >>= np.uint64(7)
        at += 1
    out[at] = np.uint8(z)
    return at + 1


@intrinsic
def _memcpy(typing_context, out, at, data, start, length):
    """out[at:at + length] = data[start:start + length] as one memcpy: numba copies a slice a byte per step (~1 ns
    per byte, most of an encoded record's cost), this at about memory speed. No bounds checked."""

    def generate(context, builder, signature, args):
        target = context.make_array(signature.args[0])(context, builder, args[0])
        source = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(target.data, [args[1]]), builder.gep(source.data, [args[3]]),
                           args[4], 1)

    return types.void(out, at, data, start, length), generate


@numba.njit(cache=True, inline="always")
def _put_bytes(out, at, data, start, length):
    _memcpy(out, at, data, start, length)
    return at + length


@numba.njit(cache=True)
def lay_out(out, order, batch_starts, batch_counts, keys, key_offsets, key_lengths, values, value_offsets,
            value_lengths, headers, header_offsets, header_lengths, header_counts):
    """Batch after batch, HEADER_SIZE zero bytes (the batch's header, packed afterwards) then its records: batch
    b's are the rows order[batch_starts[b]:][:batch_counts[b]], offset deltas from 0, timestamp deltas 0. A row's
    headers are headers[header_offsets[row]:][:header_lengths[row]], already encoded, `header_counts[row]` of them.
    Writes into `out`, which must have room for HEADER_SIZE per batch and 27 bytes per record (5 varints of up to
    5 bytes, attributes and timestamp delta) over its key, value and headers; returns where each batch starts
    (and the last ends)."""
    bounds = np.empty(len(batch_starts) + 1, np.int64)
    at = np.int64(0)
    for b in range(len(batch_starts)):
        bounds[b] = at
        out[at:at + HEADER_SIZE] = 0
        at += HEADER_SIZE
        for delta in range(batch_counts[b]):
            row = order[batch_starts[b] + delta]
            key_length, value_length = np.int64(key_lengths[row]), np.int64(value_lengths[row])
            count, header_length = np.int64(header_counts[row]), np.int64(header_lengths[row])
            length = (2 + _varint_size(np.int64(delta)) + _varint_size(key_length) + max(key_length, 0)
                      + _varint_size(value_length) + max(value_length, 0) + _varint_size(count) + header_length)
            at = _put_varint(out, at, length)
            out[at] = 0  # attributes
            out[at + 1] = 0  # timestamp delta
            at = _put_varint(out, at + 2, np.int64(delta))
            at = _put_varint(out, at, key_length)
            at = _put_bytes(out, at, keys, np.int64(key_offsets[row]), max(key_length, 0))
            at = _put_varint(out, at, value_length)
            at = _put_bytes(out, at, values, np.int64(value_offsets[row]), max(value_length, 0))
            at = _put_varint(out, at, count)
            at = _put_bytes(out, at, headers, np.int64(header_offsets[row]), header_length)
    bounds[len(batch_starts)] = at
    return bounds
