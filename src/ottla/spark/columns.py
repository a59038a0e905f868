"""Fetched v2 record batches to Arrow columns, with no Python object per record.

The source's read tasks used to take one confluent-kafka Message per record and build the Arrow columns
from Python lists: 1.5-4.4 us of a Spark worker's CPU per 100-byte record over what Spark's Python data
source exchange costs (docs/performance.md, Spark section). Here a Fetch response's record set is walked
by two numba-compiled loops, batch headers first (the reader decides in Python, per batch, what to skip:
control batches, aborted transactions, offsets outside the range), then the records of the kept batches
into numpy arrays (offset, timestamp, where each key, value and header list starts and how long it is);
keys and values are then gathered into contiguous Arrow binary buffers. The varint walk is serial, which
is why it is compiled (kernels.py: numba, cached on disk, so a worker pays its load once, not a
compilation). Small answers (under `COMPILED_FROM_BYTES`) take the broker's record-by-record decoder
instead: a small micro-batch on a fresh Python worker would otherwise pay 0.5 s of CPU to load numba.

Record layout (records.py has the slow, object-per-record path the broker uses): length varint |
attributes i8 | timestamp_delta varlong | offset_delta varint | key_length varint | key |
value_length varint | value | header_count varint | (key_length varint | key | value_length varint | value)*
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import ErrorCode, KafkaError
from ..records.batch import COMPRESSION_MASK, CONTROL_BIT, HEADER_SIZE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, \
    read_header
from ..records.compression import NONE, decompress
from ..records.control import parse_control_batch
from ..records.records import decode_batch

__all__ = ["FetchedColumns", "decode_record_set"]

# Answers smaller than this are decoded record by record with the broker's own decoder (records.py), at
# about 3 us per 100-byte record: 128 KiB is about 1,000 of them, 3 ms, against the 0.5 s of CPU that
# loading the compiled loops costs a Python worker the first time (kernels.py).
COMPILED_FROM_BYTES = 128 * 1024

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
    if len(records) < COMPILED_FROM_BYTES:
        return _decoded_in_python(records, start, end, aborted, headers_type)
    from . import kernels as k

    buf = np.frombuffer(records, np.uint8)
    batches = k.scan_batches(buf)
    if not batches.shape[1]:
        return _empty(start, headers_type)
    if (batches[k.MAGIC] != 2).any():
        raise KafkaError(ErrorCode.corrupt_message, "the Spark source reads record batches v2 only")
    last_offsets = batches[k.BASE] + batches[k.LAST_DELTA]
    next_offset = max(start, int(last_offsets[-1]) + 1)
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
    log_append = (batches[k.ATTRIBUTES] & TIMESTAMP_TYPE_BIT) != 0
    rows = k.walk_records(buf, starts, ends, batches[k.COUNT], batches[k.BASE], batches[k.FIRST_TS],
                          batches[k.MAX_TS], log_append)
    if rows is None:
        raise KafkaError(ErrorCode.corrupt_message, f"malformed record in a batch at offsets {start}..{end}")
    log_append = np.repeat(log_append, batches[k.COUNT])
    if not rows.shape[1]:  # batches emptied by compaction
        return _empty(next_offset, headers_type)
    if rows[k.OFFSET, 0] < start or rows[k.OFFSET, -1] >= end:  # only the first and last batch can cross the range
        inside = (rows[k.OFFSET] >= start) & (rows[k.OFFSET] < end)
        rows, log_append = rows[:, inside].copy(), log_append[inside]
    return FetchedColumns(
        offsets=rows[k.OFFSET],
        timestamps=rows[k.TIMESTAMP],
        log_append_time=log_append,
        keys=_binary(buf, rows[k.KEY_POS], rows[k.KEY_LEN], pa.binary()),
        values=_binary(buf, rows[k.VALUE_POS], rows[k.VALUE_LEN], pa.binary()),
        headers=None if headers_type is None else _headers(buf, rows, headers_type),
        next_offset=next_offset,
    )


def _decoded_in_python(records, start: int, end: int, aborted, headers_type) -> FetchedColumns:
    """`decode_record_set` for a small answer: the same batches kept, their records decoded one by one."""
    headers, position = [], 0
    while len(records) - position >= HEADER_SIZE:  # whole batches only, as `kernels.scan_batches`
        header = read_header(records, position)
        if header.size < HEADER_SIZE or position + header.size > len(records):
            break
        if header.magic != 2:
            raise KafkaError(ErrorCode.corrupt_message, "the Spark source reads record batches v2 only")
        headers.append(header)
        position += header.size
    if not headers:
        return _empty(start, headers_type)
    next_offset = max(start, headers[-1].last_offset + 1)
    skipped = _aborted(records, [h.producer_id for h in headers], [h.attributes for h in headers],
                       [h.position for h in headers], [h.last_offset for h in headers], aborted) if aborted else ()
    kept = [(h, r) for i, h in enumerate(headers)
            if not h.is_control and h.last_offset >= start and h.base_offset < end and not (skipped and skipped[i])
            for r in decode_batch(records, h) if start <= r.offset < end]
    if not kept:
        return _empty(next_offset, headers_type)
    return FetchedColumns(
        offsets=np.array([r.offset for _, r in kept], np.int64),
        timestamps=np.array([r.timestamp for _, r in kept], np.int64),
        log_append_time=np.array([h.timestamp_type == 1 for h, _ in kept], bool),
        keys=pa.array([r.key for _, r in kept], pa.binary()),
        values=pa.array([r.value for _, r in kept], pa.binary()),
        headers=None if headers_type is None else pa.array(
            [[{"key": name, "value": value} for name, value in r.headers] for _, r in kept], headers_type),
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


def _binary(buf, positions, lengths, kind: pa.DataType) -> pa.Array:
    from .kernels import gather

    offsets, data = gather(buf, positions, lengths)
    valid = lengths >= 0
    nulls = len(valid) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(kind, len(positions), [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def _headers(buf, rows, headers_type: pa.DataType) -> pa.Array:
    from . import kernels as k

    counts = rows[k.HEADER_COUNT]
    headers = k.walk_headers(buf, rows[k.HEADERS_POS], counts, rows[k.END])
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
