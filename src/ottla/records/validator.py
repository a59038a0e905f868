"""The records inside a produced batch, checked the way Kafka's LogValidator reads them.

A batch whose header and CRC are fine can still carry records no consumer can read: a
length that runs past the batch, fewer records than the header counts (a batch claiming
2^31-1 records moves the log end by that much), or a compressed payload that does not
inflate. Kafka's broker iterates every record of a produced batch and refuses such a batch;
so do we, but without building records: each record's varint lengths are walked with kio's
readers and checked against the record and the batch. Errors are Kafka's: a record that does
not parse is INVALID_RECORD (InvalidRecordException), a payload that does not decompress is
CORRUPT_MESSAGE.

Walking records one by one in Python costs about a microsecond each, so batches of many
records take a fast path first (`_fast_walk`): Python follows only the chain of record
lengths, numpy takes runs of records of one size at once, and numpy checks every record's
fields at once; records of one size laid out alike (what most producers send) are checked a
byte column of a run at a time instead (`_uniform_runs`). It only ever says "valid"; whatever it
does not recognise goes to the full walk, which alone decides errors.

Decompression is bounded: the inflated records may take at most `INFLATE_FACTOR` times the
topic's `max.message.bytes`, inflated straight into a buffer of that size at most, so a small
gzip bomb costs neither the memory nor the time of its full size (MESSAGE_TOO_LARGE).
A caller on the event loop passes `inline`, the most record bytes it will walk itself: a batch
whose records take more (inflated) raises `BeyondInline` after at most that much inflation,
and the caller validates it again in a worker thread with no such bound (the codecs release
the GIL while they inflate; the walk in Python holds it in switch-interval slices).
"""

from __future__ import annotations

import struct
from array import array
from functools import cache

from kio.serial.errors import DecodeError
from kio.serial.readers import read_signed_varint, read_signed_varlong

from ..errors import ErrorCode, KafkaError
from .batch import HEADER_SIZE, BatchHeader
from .compression import NONE, decompress_bounded

__all__ = ["BeyondInline", "check_records", "inflate_limit", "key_value_sizes", "INFLATE_FACTOR"]

# A produced batch may inflate to this many times max.message.bytes (1 MiB by default: 32 MiB).
INFLATE_FACTOR = 32


# Below this many records numpy's fixed cost is more than walking them (measured crossover ~100).
_FAST_FROM = 128
# The smallest record: length, attributes, timestamp delta, offset delta, key, value, header count.
_MIN_RECORD = 7


def inflate_limit(max_message_bytes: int) -> int:
    return max(max_message_bytes, 1 << 20) * INFLATE_FACTOR


class BeyondInline(Exception):
    """The batch's records take more bytes than the caller's `inline` bound: validate it where
    that may take long (a worker thread)."""


def _invalid(header: BatchHeader, why: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_record, f"batch at base offset {header.base_offset}: {why}")


def check_records(buf, header: BatchHeader, limit: int, inline: int | None = None) -> None:
    """Raise KafkaError unless the batch's records parse and match its header's count;
    BeyondInline if they take more than `inline` bytes (inflated: found after inflating that much)."""
    start = header.position + HEADER_SIZE
    end = header.position + header.size
    bound = limit if inline is None else min(limit, inline)
    with memoryview(buf) as view:
        if header.compression == NONE:
            if inline is not None and end - start > inline:
                raise BeyondInline()
            data = view[start:end].toreadonly()
        else:
            try:
                data = memoryview(decompress_bounded(header.compression, view[start:end], bound)).toreadonly()
            except KafkaError as exc:
                if bound < limit and exc.code == ErrorCode.message_too_large:
                    raise BeyondInline() from None
                raise
    if header.records_count >= _FAST_FROM and _fast_walk(data, header.records_count):
        return
    try:
        count = _walk(data, header.records_count)
    except (DecodeError, ValueError, IndexError) as exc:
        raise _invalid(header, f"found invalid record structure: {exc}") from None
    if count != header.records_count:
        raise _invalid(header, f"incorrect declared batch size: {header.records_count} records declared, "
                               f"{count} present")


def _walk(data, expected: int) -> int:
    """Walk records; returns how many there were, or raises ValueError naming the first bad one.

    The one- and two-byte varints small records are made of are decoded inline (a call to
    kio's reader costs several times more); anything longer goes through kio's readers.
    """
    end = len(data)
    position = 0
    index = 0
    while position < end:
        if index == expected:
            raise ValueError("records still remaining after the declared count")
        # record length
        b = data[position]
        if b < 0x80:
            p = position + 1
        else:
            c = data[position + 1]
            if c < 0x80:
                b = (b & 0x7F) | (c << 7)
                p = position + 2
            else:
                b, n = read_signed_varint(data, position)
                b = (b << 1) ^ (b >> 63)  # back to zigzag, decoded below with the rest
                p = position + n
        length = (b >> 1) ^ -(b & 1)
        record_end = p + length
        if length <= 0 or record_end > end:
            raise ValueError(f"record {index} has length {length} and runs past the batch")
        # attributes, then the timestamp delta (varlong): skipped
        b = data[p + 1]
        if b < 0x80:
            p += 2
        else:
            p += 1 + read_signed_varlong(data, p + 1)[1]
        # offset delta: must count up from 0
        b = data[p]
        if b < 0x80:
            p += 1
        else:
            c = data[p + 1]
            if c < 0x80:
                b = (b & 0x7F) | (c << 7)
                p += 2
            else:
                b, n = read_signed_varint(data, p)
                b = (b << 1) ^ (b >> 63)
                p += n
        if (b >> 1) ^ -(b & 1) != index:
            raise ValueError(f"record {index} has offset delta {(b >> 1) ^ -(b & 1)}")
        # key and value: -1 is null
        for _ in (0, 1):
            b = data[p]
            if b < 0x80:
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    p += 2
                else:
                    b, n = read_signed_varint(data, p)
                    b = (b << 1) ^ (b >> 63)
                    p += n
            size = (b >> 1) ^ -(b & 1)
            if size > 0:
                p += size
            elif size < -1:
                raise ValueError(f"record {index} has a field of length {size}")
        if p >= record_end:
            raise ValueError(f"record {index} is shorter than its fields")
        b = data[p]  # header count
        if b == 0:
            p += 1
        else:
            headers, n = read_signed_varint(data, p)
            p = _skip_headers(data, p + n, record_end, headers, index)
        if p != record_end:
            raise ValueError(f"record {index} declares {length} bytes but its fields take {p - record_end + length}")
        position = record_end
        index += 1
    return index


def _skip_headers(data, p: int, record_end: int, count: int, index: int) -> int:
    if count < 0 or count > (record_end - p) // 2:  # a header takes two bytes at least
        raise ValueError(f"record {index} has {count} headers")
    for _ in range(count):
        key_size, n = read_signed_varint(data, p)
        p += n
        if key_size < 0:
            raise ValueError(f"record {index} has a header key of length {key_size}")
        p += key_size
        value_size, n = read_signed_varint(data, p)
        p += n
        if value_size < -1:
            raise ValueError(f"record {index} has a header value of length {value_size}")
        if value_size > 0:
            p += value_size
        if p > record_end:
            raise ValueError(f"record {index}'s headers run past it")
    return p


def _fast_walk(data, expected: int) -> bool:
    """True if every record is the common shape and valid; False means "walk it fully".

    Follows only the chain of record lengths in Python, then checks the fields of all records
    at once with numpy: varints of at most three bytes, no headers. Anything else, valid or
    not, is left to `_walk`, which gives the verdict and the error, so both always agree.
    """
    end = len(data)
    if not 0 < expected <= end // _MIN_RECORD:
        return False
    import numpy as np  # here: a broker that never sees a large batch need not load it at start

    buf = np.frombuffer(data, dtype=np.uint8)
    chain = _record_starts(data, buf, expected)
    if chain is None:
        return False
    record_start, spans = chain
    if _uniform_runs(data, buf, spans if spans is not None else _spans(record_start, end)):
        return True
    # Positions only move forward, so a record whose header count lands on its last byte
    # had every field inside it: no bound checks are needed on the way.
    record_end = np.append(record_start[1:], end)
    # Varints are compared in their zigzag form: a length L is 2L, -1 is 1.
    zigzag, p = _varints(buf, record_start)  # each length spans exactly to the next record
    if p is None or not (zigzag == 2 * (record_end - p)).all():
        return False
    _, p = _varints(buf, p + 1)  # attributes skipped, then the timestamp delta
    if p is None:
        return False
    zigzag, p = _varints(buf, p)  # offset deltas 0, 1, 2, ...
    if p is None or not (zigzag == np.arange(0, 2 * expected, 2)).all():
        return False
    walked = _key_and_value(buf, p)
    if walked is None:
        return False
    p = walked[2]
    return bool((p + 1 == record_end).all() and (buf.take(p, mode="clip") == 0).all())  # no headers


# More runs of one size than this: the per-record checks below take the batch (mixed sizes).
_MAX_RUNS = 16
# Offset deltas from these on take 2, 3 and 4 varint bytes: a run's layout changes there.
_DELTA_WIDENS = (64, 1 << 13, 1 << 20)


def _uniform_runs(data, buf, spans) -> bool:
    """True if the records come in a few runs of one size each, every record of a run laid out
    as its first: False leaves them to the per-record checks. `spans`: (first record, its
    position, size, count) of each stretch the chain of lengths went in steps of one size
    (`_record_starts`), or None.

    Producers mostly send records of one size whose fields take the same bytes each (Spark's
    sink: 2,500 records of 100 bytes a batch). The first record of each run is walked in Python;
    then each byte of it that every record must share is compared across the run at once, as
    one column of bytes (a strided slice, compared in C): the same length, key size, value size
    and header count bytes, a timestamp delta of the same width, and offset deltas counting up.
    Each record then has the first record's layout, so it is valid as the first is: its length
    ends it where the next one starts, so the run's records are the chain's whatever the chain's
    steps were. A few calls of a few microseconds per column, where numpy's per-call cost made
    every field of every record cost tens of microseconds a batch."""
    if spans is None or len(spans) > _MAX_RUNS:
        return False
    for first, start, size, count in spans:
        stop = first + count
        for cut in (*(d for d in _DELTA_WIDENS if first < d < stop), stop):
            if not _uniform_run(data, buf, start, size, first, cut - first):
                return False
            start += (cut - first) * size
            first = cut
    return True


def _spans(record_start, end: int):
    """`_uniform_runs`'s spans from the records' starts (numpy), or None if there are too many."""
    import numpy as np

    # np.diff(record_start, append=end), without its concatenation: a third of the time
    sizes = np.empty_like(record_start)
    np.subtract(record_start[1:], record_start[:-1], out=sizes[:-1])
    sizes[-1] = end - record_start[-1]
    cuts = np.flatnonzero(sizes[1:] != sizes[:-1]) + 1
    if len(cuts) >= _MAX_RUNS:
        return None
    bounds = [0, *cuts.tolist(), len(record_start)]
    return [(first, int(record_start[first]), int(sizes[first]), stop - first)
            for first, stop in zip(bounds, bounds[1:])]


# Deleted from a column of bytes, these leave only the bytes without a varint's continuation bit.
_CONTINUED = bytes(range(0x80, 0x100))


def _uniform_run(data, buf, start: int, size: int, first: int, count: int) -> bool:
    """Whether the `count` records of `size` bytes at `start` (offset deltas from `first`) all
    have the layout of the first of them, which is valid (see `_uniform_runs`)."""
    layout = _layout(data, start, size, first)
    if layout is None:
        return False
    shared, stamp, delta = layout
    if 2 * (first + count - 1) >= 1 << 7 * len(delta):
        return False  # a later delta would need more bytes than the first record's
    stop = start + count * size

    def column(offset: int) -> bytes:  # byte `offset` of every record of the run (numpy copies it fastest)
        return buf[start + offset:stop:size].tobytes()

    # Equality with the first record's byte repeated (a memcmp) costs a tenth of `bytes.count`.
    if any(column(c) != _repeated(data[start + c], count) for c in shared):
        return False
    if not column(stamp[-1]).isascii() or any(column(c).translate(None, _CONTINUED) for c in stamp[:-1]):
        return False
    return all(column(c) == wanted for c, wanted in zip(delta, _delta_columns(first, count, len(delta))))


def _repeated(byte: int, count: int) -> bytes:
    """What a column of `count` records sharing `byte` holds."""
    return _BYTES[byte] * count


_BYTES = tuple(bytes((b,)) for b in range(256))


# Offset deltas below this are sliced from a table kept per varint width (at most 192 KB).
_DELTA_TABLE = 1 << 16


def _delta_columns(first: int, count: int, width: int) -> tuple[bytes, ...]:
    """Offset deltas `first` .. `first + count - 1` as varints of `width` bytes (zigzag), one
    column of bytes per varint byte."""
    stop = first + count
    if stop > _DELTA_TABLE:
        return _encoded_deltas(first, stop, width)
    return tuple(column[first:stop] for column in _delta_table(width, max(1 << 12, 1 << (stop - 1).bit_length())))


@cache
def _delta_table(width: int, size: int) -> tuple[bytes, ...]:
    """`_encoded_deltas` from 0 up to `size` (a power of two): batches slice it."""
    return _encoded_deltas(0, size, width)


def _encoded_deltas(first: int, stop: int, width: int) -> tuple[bytes, ...]:
    import numpy as np

    zigzag = np.arange(2 * first, 2 * stop, 2, dtype=np.int64)
    return tuple((zigzag >> 7 * i & 0x7F | (0x80 if i < width - 1 else 0)).astype(np.uint8).tobytes()
                 for i in range(width))


def _layout(data, start: int, size: int, index: int):
    """The fields of the record at `start`, `size` bytes long, as column lists (offsets in the
    record): bytes every record of its run must share (length, key size, value size, header
    count), the timestamp delta's and the offset delta's; None unless the record is valid, has
    offset delta `index`, no headers, and varints of at most three bytes."""
    shared, p = [], start
    try:
        length, width = _varint(data, p)
        if width + length != size:
            return None
        shared += range(width)
        p += width + 1  # attributes: any
        _, width = _varint(data, p)
        stamp = list(range(p - start, p - start + width))
        p += width
        delta, width = _varint(data, p)
        if delta != index:
            return None
        offset_delta = list(range(p - start, p - start + width))
        p += width
        for _ in (0, 1):  # key and value: -1 is null
            field, width = _varint(data, p)
            if field < -1:
                return None
            shared += range(p - start, p - start + width)
            p += width + max(field, 0)
        if p != start + size - 1 or data[p] != 0:  # the header count, 0, ends the record
            return None
    except (IndexError, TypeError):  # past the data, or a varint longer than three bytes
        return None
    shared.append(size - 1)
    return shared, stamp, offset_delta


def _varint(data, p: int):
    """The signed varint of at most three bytes at `p` and its width; (None, None) if longer."""
    value = 0
    for i in range(3):
        b = data[p + i]
        value |= (b & 0x7F) << 7 * i
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), i + 1
    return None, None


def _key_and_value(buf, p):
    """The key and value sizes of records whose keys start at `p` (numpy arrays; a null counts
    0) and where their headers start, or None when a size is negative other than -1 (null)."""
    sizes = []
    for _ in (0, 1):
        zigzag, p = _varints(buf, p)
        if p is None:
            return None
        size = zigzag >> 1
        if ((zigzag & 1) * size).any():
            return None
        p = p + size
        sizes.append(size)
    return sizes[0], sizes[1], p


def key_value_sizes(data, count: int):
    """The key and value sizes of `count` records (decompressed, `data`) as two numpy arrays
    (a null counts 0), for Fetch v0-3's down-conversion to size its messages; None unless
    there are many records and all of the shape `_fast_walk` reads (the caller walks them).
    The same chain and varints, from stored batches the validator already accepted."""
    if count < _FAST_FROM or not count <= len(data) // _MIN_RECORD:
        return None
    import numpy as np

    buf = np.frombuffer(data, dtype=np.uint8)
    chain = _record_starts(data, buf, count)
    if chain is None:
        return None
    record_start = chain[0]
    record_end = np.append(record_start[1:], len(data))
    zigzag, p = _varints(buf, record_start)
    if p is None or not (zigzag == 2 * (record_end - p)).all():
        return None
    _, p = _varints(buf, p + 1)  # attributes skipped, then the timestamp delta
    if p is None:
        return None
    _, p = _varints(buf, p)  # offset delta
    if p is None:
        return None
    walked = _key_and_value(buf, p)
    if walked is None:
        return None
    key_sizes, value_sizes, p = walked
    # Positions only move forward: the header count inside its record means every field was.
    return (key_sizes, value_sizes) if (p < record_end).all() else None


# The chain of record lengths reads two bytes at each record's start: one struct call and one
# table lookup per record instead of indexing and branching in Python (a quarter less time
# for any mix of sizes: 1,000 records of 1 KiB 169 -> 127 us, of 10-2,000 bytes 174 -> 128 us).
_WINDOW = struct.Struct("<H").unpack_from
# Records followed one by one before looking for a run of equal lengths (see `_record_starts`).
_BLOCK = 16


def _record_starts(data, buf, expected: int):
    """Where each record starts, following the chain of record lengths, and the spans of records
    it went through in steps of one size (first record, position, size, count: for
    `_uniform_runs`; None once a block's steps differ); None unless the chain takes exactly
    `expected` steps to the end of the data.

    Producers often send records of one size, so after each block of `_BLOCK` records that all
    took the same step, numpy checks how many of the following records start with the very
    same length bytes (`_same_length`) and takes them all at once: a run costs a few numpy
    calls instead of a Python step per record. Records of mixed sizes never make a block of
    equal steps and pay only one comparison per block.
    """
    import numpy as np

    end = len(data)
    step, window = _steps(), _WINDOW
    starts = array("q", bytes(8 * expected))  # 8 bytes a record, no int objects kept
    found = np.frombuffer(starts, dtype=np.int64)
    position = index = 0
    block = _BLOCK
    spans: list | None = []
    try:  # only the chain here; every length is checked by the caller
        while index < expected:
            block_start, block_end = position, min(index + block, expected)
            for i in range(index, block_end):
                starts[i] = position
                position += step[window(data, position)[0]]
            size = position - starts[block_end - 1]
            equal = position - block_start == (block_end - index) * size
            if spans is not None:
                spans = _span(spans, index, block_start, size, block_end - index) if equal else None
            index = block_end
            run = 0
            if equal and index < expected:
                run = _same_length(buf, position, size, min(expected - index, (end - position) // size))
                found[index:index + run] = np.arange(position, position + run * size, size)
                if spans is not None and run:
                    spans = _span(spans, index, position, size, run)
                index += run
                position += run * size
            # A check costs about what a block of Python steps does, so a run shorter than a
            # block did not pay for it: mixed sizes, or a batch made to alternate sizes, get
            # ever longer stretches between checks.
            block = _BLOCK if run >= _BLOCK else 2 * block
    except (IndexError, struct.error):
        return None
    return (found, spans) if position == end else None


def _span(spans: list, first: int, position: int, size: int, count: int):
    """`spans` with `count` records of `size` bytes from record `first` at `position`: the last
    span grown if it is of that size, else a new one; None past `_MAX_RUNS` spans."""
    if spans and spans[-1][2] == size:
        last = spans[-1]
        spans[-1] = (last[0], last[1], size, last[3] + count)
        return spans
    spans.append((first, position, size, count))
    return spans if len(spans) <= _MAX_RUNS else None


def _same_length(buf, position: int, size: int, count: int) -> int:
    """How many of the `count` records at `position`, `position + size`, ... in a row start with
    the same length varint (one or two bytes) as the record `size` bytes before `position`.
    Each length byte of the records is one column of bytes (a strided copy, which numpy makes
    fastest) whose leading run `lstrip` measures in C: a few microseconds where numpy's compare,
    `all` and `argmin` took tens."""
    if count <= 0:
        return 0
    stop = position + count * size
    run = count
    for i in range(2 if buf[position - size] >= 0x80 else 1):
        column = buf[position + i:stop:size].tobytes()
        run = min(run, count - len(column.lstrip(bytes((int(buf[position - size + i]),)))))
    return run


@cache
def _steps() -> array:
    """Bytes from a record's start to the next record's, indexed by its first two bytes (little
    endian): the length varint read as one or two bytes. A longer varint gives a wrong step;
    the numpy checks refuse the chain then, and the full walk decides."""
    return array("H", [1 + (b0 >> 1) if b0 < 0x80 else 2 + (((b0 & 0x7F) | (b1 << 7)) >> 1)
                       for b1 in range(256) for b0 in range(256)])


def _varints(buf, p):
    """The varints of one to three bytes at `p`, still in zigzag form, and where they end; None
    if any is longer. One byte each, the usual case, costs three numpy calls.

    Three bytes cover every offset delta a batch within max.message.bytes can have: librdkafka
    sends batches of up to 10,000 records, whose offset deltas from 8,192 on take three bytes.
    """
    import numpy as np

    first = buf.take(p, mode="clip")
    more = first >= 0x80
    if not more.any():
        return first, p + 1
    value = first.astype(np.int64)
    value &= 0x7F
    end = p + 1
    for shift in (7, 14):
        c = buf.take(end, mode="clip")
        value |= np.where(more, (c & 0x7F).astype(np.int64) << shift, 0)
        end = end + more
        more &= c >= 0x80
        if not more.any():
            return value, end
    return None, None
