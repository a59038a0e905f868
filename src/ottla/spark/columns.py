"""Fetched v2 record batches to Arrow columns, with no Python object per record.

The source's read tasks used to take one confluent-kafka Message per record and build the Arrow columns
from Python lists: 1.5-4.4 us of a Spark worker's CPU per 100-byte record over what Spark's Python data
source exchange costs (docs/performance.md, Spark section). Here a Fetch response's record set is walked
batch headers first (the reader decides in Python, per batch, what to skip: control batches, aborted
transactions, offsets outside the range), then the records of the kept batches into numpy arrays (offset,
timestamp, where each key, value and header list starts and how long it is); keys and values are then
taken into contiguous Arrow binary buffers. Two walkers give the same answers: walk.py (Python over
record starts where records differ in size, numpy for the rest) and kernels.py (numba, 0.03 us per
record, but 0.45-0.6 s of CPU to load in each fresh Spark Python worker). A process starts with walk.py
and loads numba once walk.py (with the sink's numpy encoder: one account, compiled.py) has taken
`COMPILED_AFTER_SECONDS` of CPU more than numba would have, when
the time numba would have saved has reached its cost (the rent-or-buy rule: never more than about twice
the better of the two, whatever the job's length and whatever the records: walk.py's extra cost is
0.1-0.2 us per 100-byte record of one size, 0.35-0.6 us for values of varied sizes).

Record layout (records.py has the slow, object-per-record path the broker uses): length varint |
attributes i8 | timestamp_delta varlong | offset_delta varint | key_length varint | key |
value_length varint | value | header_count varint | (key_length varint | key | value_length varint | value)*
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import ErrorCode, KafkaError
from ..records.batch import COMPRESSION_MASK, CONTROL_BIT, HEADER_SIZE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, \
    read_header
from ..records.compression import NONE, decompress
from ..records.control import parse_control_batch
from . import compiled, walk
from .walk import binary_column

__all__ = ["FetchedColumns", "decode_record_set"]

# What walk.py's charge to compiled.py's account is counted against: kernels.walk_records, 100-byte records.
_KERNEL_SECONDS_PER_RECORD = 0.03e-6


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
                      headers_type: pa.DataType | None = None, ahead=None) -> FetchedColumns:
    """The records of a Fetch answer's record set at offsets [start, end). Control batches are skipped;
    with `aborted` (read_committed: the answer's (producer id, first offset) list) so are the batches of
    aborted transactions. `headers_type`: build the headers column with it (else none). `ahead`: called
    with the next offset to fetch once the batch headers give it (it is past `start`), before the records
    are walked: the reader sends its next Fetch then."""
    return _decode(compiled.kernels() or walk, records, start, end, aborted, headers_type, ahead)


def _decode(k, records, start: int, end: int, aborted: list[tuple[int, int]] | None,
            headers_type: pa.DataType | None, ahead=None) -> FetchedColumns:
    """`decode_record_set` with the walker `k`: walk.py or kernels.py."""
    buf = np.frombuffer(records, np.uint8)
    batches = k.scan_batches(buf)
    if not batches.shape[1]:
        return _empty(start, headers_type)
    if (batches[k.MAGIC] != 2).any():
        raise KafkaError(ErrorCode.corrupt_message, "the Spark source reads record batches v2 only")
    last_offsets = batches[k.BASE] + batches[k.LAST_DELTA]
    next_offset = max(start, int(last_offsets[-1]) + 1)
    if ahead is not None and next_offset > start:
        ahead(next_offset)
    attributes = batches[k.ATTRIBUTES]
    keep = ((attributes & CONTROL_BIT) == 0) & (last_offsets >= start) & (batches[k.BASE] < end)
    if aborted:
        keep &= ~np.array(_aborted(records, batches[k.PRODUCER].tolist(), attributes.tolist(),
                                   batches[k.POS].tolist(), last_offsets.tolist(), aborted), bool)
    if not keep.any():
        return _empty(next_offset, headers_type)
    batches = np.ascontiguousarray(batches[:, keep])  # one layout: numba compiles one version per layout
    starts, ends = batches[k.POS] + HEADER_SIZE, batches[k.POS] + batches[k.SIZE]
    codecs = batches[k.ATTRIBUTES] & COMPRESSION_MASK
    if codecs.any():
        buf, starts, ends = _inflated(records, starts, ends, codecs)
    counts = batches[k.COUNT]
    if ((counts < 0) | (counts * walk.MIN_RECORD_BYTES > ends - starts)).any():  # the walkers' arrays are sized by it
        raise KafkaError(ErrorCode.corrupt_message, f"malformed batch at offsets {start}..{end}: its record count")
    log_append = (batches[k.ATTRIBUTES] & TIMESTAMP_TYPE_BIT) != 0
    walking = time.thread_time()
    rows = k.walk_records(buf, starts, ends, counts, batches[k.BASE], batches[k.FIRST_TS], batches[k.MAX_TS],
                          log_append)
    if k is walk:
        compiled.charge(time.thread_time() - walking - _KERNEL_SECONDS_PER_RECORD * int(counts.sum()))
    if rows is None:
        raise KafkaError(ErrorCode.corrupt_message, f"malformed record in a batch at offsets {start}..{end}")
    log_append = np.repeat(log_append, counts)
    if not rows.shape[1]:  # batches emptied by compaction
        return _empty(next_offset, headers_type)
    if rows[k.OFFSET, 0] < start or rows[k.OFFSET, -1] >= end:  # only the first and last batch can cross the range
        inside = (rows[k.OFFSET] >= start) & (rows[k.OFFSET] < end)
        rows, log_append = rows[:, inside].copy(), log_append[inside]
    data = pa.py_buffer(buf)
    return FetchedColumns(
        offsets=rows[k.OFFSET],
        timestamps=rows[k.TIMESTAMP],
        log_append_time=log_append,
        keys=binary_column(data, rows[k.KEY_POS], rows[k.KEY_LEN], pa.binary()),
        values=binary_column(data, rows[k.VALUE_POS], rows[k.VALUE_LEN], pa.binary()),
        headers=None if headers_type is None else _headers(k, buf, data, rows, headers_type),
        next_offset=next_offset,
    )


def _aborted(records, producers, attributes, positions, last_offsets, aborted: list[tuple[int, int]]) -> list:
    """Which batches belong to aborted transactions, as Kafka's consumer finds them: a producer's
    transactional batches from its aborted transaction's first offset on, until that producer's ABORT
    marker. One entry per batch; the batches are given by their fields, in order."""
    pending = sorted(aborted, key=lambda txn: txn[1], reverse=True)
    aborting: set[int] = set()
    out = [False] * len(producers)
    for i, producer_id in enumerate(producers):
        if producer_id < 0:
            continue
        while pending and pending[-1][1] <= last_offsets[i]:
            aborting.add(pending.pop()[0])
        if attributes[i] & CONTROL_BIT:
            marker = parse_control_batch(records, read_header(records, positions[i]))
            if marker is not None and not marker.commit:
                aborting.discard(producer_id)
        elif attributes[i] & TRANSACTIONAL_BIT and producer_id in aborting:
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


def _headers(k, buf, data: pa.Buffer, rows, headers_type: pa.DataType) -> pa.Array:
    """The headers column; `k`: the walker that found the records (walk or kernels)."""
    counts = rows[k.HEADER_COUNT]
    headers = k.walk_headers(buf, rows[k.HEADERS_POS], counts, rows[k.END])
    if headers is None:
        raise KafkaError(ErrorCode.corrupt_message, "malformed record header")
    entry = headers_type.value_type
    keys = binary_column(data, headers[0], headers[1], entry.field("key").type)
    try:
        keys.validate(full=True)  # header keys are UTF-8 strings
    except pa.ArrowInvalid as exc:
        raise KafkaError(ErrorCode.corrupt_message, f"record header key: {exc}") from None
    values = binary_column(data, headers[2], headers[3], entry.field("value").type)
    struct = pa.StructArray.from_arrays([keys, values], fields=list(entry))
    list_offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    offsets = pa.Array.from_buffers(pa.int32(), len(list_offsets), [None, pa.py_buffer(list_offsets)])
    return pa.ListArray.from_arrays(offsets, struct, type=headers_type)  # not pa.array(): it imports pandas


def _empty(next_offset: int, headers_type: pa.DataType | None) -> FetchedColumns:
    nothing = np.empty(0, np.int64)
    return FetchedColumns(nothing, nothing, np.empty(0, bool), pa.array([], pa.binary()), pa.array([], pa.binary()),
                          None if headers_type is None else pa.array([], headers_type), next_offset)


def _first_calls(kernels) -> None:
    """The walker's loops called once each with the types a Fetch answer's decoding passes them (compiled.py)."""
    from ..records.records import Record, build_batch

    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    _decode(kernels, build_batch([Record(b"k", b"v", (("h", b"v"),), 0)]), 0, 1, None, headers_type)


compiled.warm_up(_first_calls)
