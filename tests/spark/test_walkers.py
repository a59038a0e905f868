"""The source's two record walkers (spark/walk.py, Python with numpy; spark/kernels.py, numba) and the
broker's own decoder (records.py) give the same answer for any batch, malformed ones included.

walk.py finds record starts in runs of records of one size, guessing where the next ones start and
checking the guesses in numpy; so the batches here come in runs (fixed-size keys and values) broken by
records of other sizes, by varints that grow (offset and timestamp deltas), by a record length written
with more bytes than it needs (the same length, other bytes), and then damaged: bytes overwritten in the
records section, or a wrong record count. Every decoder must then agree: the same records, or
CORRUPT_MESSAGE from each (never another exception)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from ottla.errors import ErrorCode, KafkaError
from ottla.records.batch import HEADER_SIZE
from ottla.records.records import Record, build_batch, iter_batches
from ottla.spark import compiled as switch
from ottla.spark.columns import decode_record_set

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# A run: how many records, their key and value sizes (None: null), whether they carry a header.
runs = st.lists(st.tuples(st.integers(1, 90), st.none() | st.integers(0, 12), st.none() | st.integers(0, 150),
                          st.booleans()), min_size=1, max_size=5)
batch_plans = st.tuples(runs, st.sampled_from([0, 1, 3, 1000]))  # and the timestamp step between records
damage = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3)


def batch(plan) -> bytes:
    run_list, step = plan
    out, index = [], 0
    for count, key_size, value_size, header in run_list:
        for _ in range(count):
            fill = bytes([index % 251])
            out.append(Record(None if key_size is None else fill * key_size,
                              None if value_size is None else fill * value_size,
                              (("h", fill),) if header else (), 1_000 + index * step))
            index += 1
    return build_batch(out)


def widen_lengths(data: bytes, every: int) -> bytes:
    """The batch with every `every`-th record's length varint written one byte longer (a continuation
    byte, then a zero: the same value), its batch length grown to match."""
    out, position, index = bytearray(data[:HEADER_SIZE]), HEADER_SIZE, 0
    while position < len(data):
        width = 1
        while data[position + width - 1] >= 0x80:
            width += 1
        varint = bytearray(data[position:position + width])
        length = 0
        for shift, byte in enumerate(varint):
            length |= (byte & 0x7F) << (7 * shift)
        length = (length >> 1) ^ -(length & 1)
        if index % every == 0 and width < 10:
            varint[-1] |= 0x80
            varint.append(0)
        out += varint + data[position + width:position + width + length]
        position += width + length
        index += 1
    out[8:12] = (len(out) - 12).to_bytes(4, "big")
    return bytes(out)


def damaged(data: bytes, hits, count_change: int) -> bytes:
    out = bytearray(data)
    for where, byte in hits:
        out[HEADER_SIZE + where % (len(out) - HEADER_SIZE)] = byte
    count = int.from_bytes(out[57:61], "big", signed=True) + count_change
    out[57:61] = count.to_bytes(4, "big", signed=True)
    return bytes(out)


def through_columns(data: bytes, compiled: bool):
    saved = switch.COMPILED_AFTER_SECONDS
    switch.COMPILED_AFTER_SECONDS = 0 if compiled else float("inf")
    if compiled:
        switch.load()  # not left to the switch: another process may hold its lock
    try:
        got = decode_record_set(data, -(1 << 62), 1 << 62, None, HEADERS)  # damaged deltas: any offset
    except KafkaError as exc:
        assert exc.code == ErrorCode.corrupt_message
        return "CORRUPT_MESSAGE"
    finally:
        switch.COMPILED_AFTER_SECONDS = saved
    return list(zip(got.offsets.tolist(), got.timestamps.tolist(), got.keys.to_pylist(), got.values.to_pylist(),
                    [[(h["key"], h["value"]) for h in hs] for hs in got.headers.to_pylist()]))


def through_records(data: bytes):
    try:
        return [(r.offset, r.timestamp, r.key, r.value, list(r.headers))
                for _, records in iter_batches(data) for r in records]
    except KafkaError as exc:
        assert exc.code == ErrorCode.corrupt_message
        return "CORRUPT_MESSAGE"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Runs of one size broken where the offset delta's varint grows (64) and by null keys and values.
@example(plans=[([(70, 3, 100, False), (20, None, None, False), (40, 3, 100, True)], 1)], every=0, hits=[],
         count_change=0)
# A run whose 30th record's length is written with a byte more: the run must break there.
@example(plans=[([(60, 3, 100, False)], 0)], every=30, hits=[], count_change=0)
@given(plans=st.lists(batch_plans, min_size=1, max_size=3), every=st.integers(0, 40), hits=damage,
       count_change=st.sampled_from([0, 0, 0, -1, 1, 7]))
def test_the_walkers_and_the_broker_decoder_agree(plans, every, hits, count_change):
    data = b""
    for plan in plans:
        one = batch(plan)
        if every:
            one = widen_lengths(one, every)
        data += damaged(one, hits, count_change) if hits or count_change else one
    expected = through_records(data)
    assert through_columns(data, compiled=False) == expected
    assert through_columns(data, compiled=True) == expected


@pytest.mark.parametrize("size", [1, 15, 16, 17, 5000])
def test_fixed_size_records_decode_in_runs(size):
    """Batches of every size around the walker's shortest run, in one answer."""
    data = b"".join(batch(([(count, 4, 100, False)], 1)) for count in (size, size, 3, size))
    assert through_columns(data, compiled=False) == through_columns(data, compiled=True) == through_records(data)
