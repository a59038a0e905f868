"""The source's decoder loops without a compiler (columns.py): Python over batch headers and record
starts, numpy over everything else.

A record's length comes first, so where the next record starts is only known once this one's length is
read: that walk is serial, a few Python bytecodes per record (0.2-0.35 us), but where records come in runs
of one size (fixed-size values) a run's starts are guessed and checked in numpy (`_Heads`), 0.03-0.06 us
per record. Every other field (timestamp and offset deltas, key and value lengths, the header count) is
then decoded for all records at once, one vectorised varint read per field. About 0.2-0.3 us per
100-byte record of one size in all and 0.45-0.7 us for values of varied sizes, against 0.1 us for the
numba loops (kernels.py), which take 0.45-0.6 s of CPU to load in each fresh Spark Python worker:
columns.py starts with these and moves to numba once they have cost a worker that much more.
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
    heads = _Heads(buf)
    try:
        for start, end, count in zip(starts.tolist(), ends.tolist(), counts.tolist()):
            if heads.walk(start, end, count) != end:
                return None
    except IndexError:  # a length ran past the answer
        return None
    head = heads.array()
    end = np.empty_like(head)  # each record's end: the next one's head, or its batch's end
    end[:-1] = head[1:]
    full = counts > 0
    end[np.cumsum(counts)[full] - 1] = ends[full]
    length, position, ok = varints(buf, head, end)
    ok &= length >= 1  # the walk went forward, so every record lies within its batch
    out = np.empty((9, len(head)), np.int64)
    out[END] = end
    position += 1  # the attributes
    timestamp_delta, position, good = varints(buf, position, end)
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
    # Each batch's fields repeated over its records (no index of batches to gather by), added in place.
    np.add(np.repeat(base_offsets, counts), offset_delta, out=out[OFFSET])
    np.add(np.repeat(first_timestamps, counts), timestamp_delta, out=out[TIMESTAMP])
    if log_append.any():
        np.copyto(out[TIMESTAMP], np.repeat(max_timestamps, counts), where=np.repeat(log_append, counts))
    return out


class _Heads:
    """Where each record of an answer's batches starts, found in runs where records have one size.

    Fixed-size values make long runs of records of one size, broken only where a varint grows a byte (the
    offset delta at 64, a key's length at 10...). From a record whose length varint has `width` bytes and
    says `length`, the next records are guessed at every `width + length` bytes and their length varints
    compared, bytes for bytes, with this one's in one numpy pass: the matching prefix is the true chain (a
    record with that same varint is followed by the next at that same stride, by induction), and the walk
    steps on in Python where it breaks. A run under `_RUN` records is not worth its numpy calls: the next
    record's and the run's last record's varints are compared in Python first, and where records differ
    in size (JSON values) the walk then steps some records in Python before it guesses again, twice as
    many after every failed guess (`_FIRST_BACKOFF` up to `_MAX_BACKOFF`). The heads are those of the
    plain serial walk (`_steps`) for any bytes, malformed ones included: a guess only starts on a head,
    keeps to its batch, and a length under `MIN_RECORD_BYTES` is left to the serial walk."""

    def __init__(self, buf: np.ndarray):
        self.buf = buf
        # The serial walk indexes bytes (an int per index, no numpy scalar): those `buf` views, if it views
        # a whole bytes object (a Fetch answer's record set, or the inflated one), else a copy.
        whole = buf.base
        viewed = type(whole) is bytes and len(whole) == len(buf) and buf.flags.c_contiguous
        self.data = whole if viewed else buf.tobytes()
        self.parts: list[np.ndarray] = []  # the heads found so far, in order, but for
        self.pending: list[int] = []  # those stepped in Python since the last run
        self.due = 0  # records to step in Python before the next guess
        self.backoff = _FIRST_BACKOFF

    def walk(self, position: int, end: int, count: int) -> int:
        """Find the heads of `count` records from `position`; return the position after the last one.
        No bounds here but the batch's `end` for runs: `walk_records` checks afterwards that the walk
        ended at its batch's end and that every length was at least 1 (so that it only went forward)."""
        while count > 0:
            if self.due <= 0 and count >= _RUN:
                taken, position = self._run(position, end, count)
                count -= taken
                if taken >= _RUN:
                    self.backoff = _FIRST_BACKOFF
                    continue
                self.due = self.backoff
                self.backoff = min(2 * self.backoff, _MAX_BACKOFF)
                if not count:
                    break
            steps = count if self.due <= 0 else min(count, self.due)
            position = _steps(self.data, position, steps, self.pending)
            count -= steps
            self.due -= steps
        return position

    def _run(self, position: int, end: int, count: int) -> tuple[int, int]:
        """(records, position after them) of the run of records from the head at `position` whose length
        varints are byte for byte that one's; (0, position) when that run is under `_RUN` records, or the
        length not a well-formed varint of a plausible record."""
        if position < 0:  # a negative length went back past the answer's start: the checks will fail it
            return 0, position
        data = self.data
        width = 1
        while data[position + width - 1] >= 0x80:
            if width == _MAX_VARINT:
                return 0, position
            width += 1
        raw, _ = _varint(data, position)
        stride = width + ((raw >> 1) ^ -(raw & 1))
        if stride < MIN_RECORD_BYTES or position + _RUN * stride > end:
            return 0, position
        # Whether the next record and the run's last have this length varint, in Python first: a short run
        # fails there, without numpy (where either does not, the run cannot reach `_RUN` records).
        varint = data[position:position + width]
        second, last = position + stride, position + (_RUN - 1) * stride
        if data[second:second + width] != varint or data[last:last + width] != varint:
            return 0, position
        start, taken, window = position, 0, _FIRST_WINDOW
        head = self.buf[position:position + width]
        while taken < count:
            n = min(window, count - taken, (end - position) // stride)
            if n <= 0:
                break
            rows = self.buf[position:position + n * stride].reshape(n, stride)
            same = rows[:, 0] == head[0]
            for i in range(1, width):
                same &= rows[:, i] == head[i]
            if not same.all():
                matched = int(same.argmin())
                taken, position = taken + matched, position + matched * stride
                break
            taken, position, window = taken + n, position + n * stride, 4 * window
        if self.pending:
            self.parts.append(np.array(self.pending, np.int64))
            self.pending = []
        self.parts.append(np.arange(start, position, stride, dtype=np.int64))
        return taken, position

    def array(self) -> np.ndarray:
        """Every head found, in order."""
        return np.concatenate(self.parts + [np.array(self.pending, np.int64)])


# A run shorter than this does not pay for its numpy calls (about 5 us, against 0.2-0.35 us per record
# stepped in Python); a run looks this many records ahead first, then four times more each pass. A guess
# that fails in Python costs about two records' steps: `_MAX_BACKOFF` keeps that under 2% of a walk.
_RUN = 16
_FIRST_WINDOW = 64
_FIRST_BACKOFF = 4
_MAX_BACKOFF = 128


def _steps(data, position: int, count: int, heads: list) -> int:
    """Append where each of `count` records from `position` starts (its length varint); return the
    position after the last one. The serial walk: a record's length says where the next one starts."""
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
    each lay wholly before its `ends`). Nearly all are one or two bytes: both are read for every varint
    at once (a field of two-byte varints, a 100-byte value's length, costs no indexing by the ones going
    on), then one pass per further byte over those still going."""
    ok = positions < ends
    inside = bool(ok.all())  # the common case: no masking of the indexes, nor of the bytes read
    first = buf[positions if inside else np.where(ok, positions, 0)]
    after = positions + 1
    more = first >= 0x80
    if not inside:
        more &= ok
    if not more.any():  # one byte each (where `ok`; the rest is never used)
        return _zigzag(first.astype(np.int64)), after, ok
    raw = (first & 0x7F).astype(np.int64)
    if inside and bool(more.all()):  # two bytes or more each: a 100-byte value's length
        ok = after < ends
        inside = bool(ok.all())
        more = ok
        second = buf[after if inside else np.where(ok, after, 0)]
        raw |= (second & 0x7F).astype(np.int64) << 7
        after += 1 if inside else ok
    else:
        ok &= (after < ends) | ~more
        more &= ok
        second = buf[np.where(more, after, 0)]
        raw |= (second & np.where(more, 0x7F, 0).astype(np.uint8)).astype(np.int64) << 7
        after += more
    going = np.flatnonzero(more & (second >= 0x80))
    for shift in range(14, 7 * _MAX_VARINT, 7):
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
    return _zigzag(raw), after, ok


def _zigzag(raw: np.ndarray) -> np.ndarray:
    """The signed values of raw zigzag varints, computed in `raw` itself (one temporary, not four)."""
    sign = raw & 1
    np.negative(sign, out=sign)
    raw >>= 1
    raw &= 0x7FFFFFFFFFFFFFFF
    raw ^= sign
    return raw


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
