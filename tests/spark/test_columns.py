"""The Spark source's column-wise decoder (ottla/spark/columns.py) against the broker's own batch encoder.

Record sets are built with `ottla.records` (what the broker stores and serves): batches of every codec,
both timestamp types, null keys and values, headers, transactions committed and aborted with their
markers, and a torn batch at the end, as a Fetch answer cut at its byte limit has. What a read_committed
consumer must see is known from how the set was built, not from a second decoder."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from ottla.errors import KafkaError
from ottla.records.batch import set_base_offset
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch
from ottla.spark import compiled
from ottla.spark.columns import decode_record_set

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
CODECS = ["uncompressed", "gzip", "snappy", "lz4", "zstd"]

records = st.lists(st.builds(
    Record,
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=300),
    headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3).map(tuple),
    timestamp=st.integers(0, 2**41),
), min_size=1, max_size=20)

# One step of a partition's history: a plain batch, a transactional batch of producer 1 or 2, or the end
# (commit or abort) of that producer's open transaction.
steps = st.lists(st.one_of(
    st.tuples(st.just("plain"), records, st.sampled_from(CODECS), st.integers(0, 1)),
    st.tuples(st.just("txn"), st.integers(1, 2), records, st.sampled_from(CODECS)),
    st.tuples(st.just("end"), st.integers(1, 2), st.booleans()),
), min_size=1, max_size=12)


def record_set(history):
    """(bytes, aborted [(producer id, first offset)], the records a read_committed reader sees as
    (offset, Record, log-append time?) in order, next offset)."""
    out, aborted, visible = bytearray(), [], []
    offset = 5
    open_txns: dict[int, tuple[int, list]] = {}  # producer -> (first offset, its records)

    def append(batch: bytes, count: int) -> None:
        nonlocal offset
        batch = bytearray(batch)
        set_base_offset(batch, 0, offset)
        out.extend(batch)
        offset += count

    for step in history + [("end", producer, True) for producer in (1, 2)]:
        if step[0] == "plain":
            _, recs, codec, timestamp_type = step
            append(build_batch(recs, compression=codec, timestamp_type=timestamp_type), len(recs))
            stamp = max(r.timestamp for r in recs)
            visible += [(offset - len(recs) + i, r._replace(timestamp=stamp) if timestamp_type else r)
                        for i, r in enumerate(recs)]
        elif step[0] == "txn":
            _, producer, recs, codec = step
            first, held = open_txns.setdefault(producer, (offset, []))
            held += [(offset + i, r) for i, r in enumerate(recs)]
            append(build_batch(recs, producer_id=producer, producer_epoch=0, base_sequence=0,
                               is_transactional=True, compression=codec), len(recs))
        elif step[1] in open_txns:
            _, producer, commit = step
            first, held = open_txns.pop(producer)
            if commit:
                visible += held
            else:
                aborted.append((producer, first))
            append(build_control_batch(producer, 0, 0, commit, 1_000), 1)
    return bytes(out), aborted, sorted(visible, key=lambda item: item[0]), offset


ONE = [Record(b"k", b"v", (), 1)]


@pytest.fixture(params=["compiled", "vectorised"], autouse=True)
def decoder(request):
    """Every test runs against both walkers: numba's (kernels.py) and Python with numpy's (walk.py)."""
    saved = compiled.COMPILED_AFTER_SECONDS
    compiled.COMPILED_AFTER_SECONDS = 0 if request.param == "compiled" else float("inf")
    if request.param == "compiled":
        compiled.load()  # not left to the switch: another process may hold its lock
    yield request.param
    compiled.COMPILED_AFTER_SECONDS = saved


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# A producer's transaction aborted, then its next one committed: the ABORT marker ends the skipping.
@example(history=[("txn", 1, ONE, "uncompressed"), ("end", 1, False), ("txn", 1, ONE, "lz4"), ("end", 1, True)],
         cut=(0, 200), torn=0)
@given(history=steps, cut=st.tuples(st.integers(0, 200), st.integers(0, 200)), torn=st.integers(0, 60))
def test_decoded_columns_are_the_records_a_read_committed_reader_sees(history, cut, torn):
    data, aborted, visible, log_end = record_set(history)
    start, end = min(cut), max(cut)
    # A torn batch after the whole ones: some bytes of a copy of the first batch, which is ignored.
    columns = decode_record_set(data + data[:torn], start, end, aborted, HEADERS)
    expected = [(o, r) for o, r in visible if start <= o < end]
    assert columns.offsets.tolist() == [o for o, _ in expected]
    assert columns.keys.to_pylist() == [r.key for _, r in expected]
    assert columns.values.to_pylist() == [r.value for _, r in expected]
    assert columns.timestamps.tolist() == [r.timestamp for _, r in expected]
    assert columns.headers.to_pylist() == [[{"key": k, "value": v} for k, v in r.headers] for _, r in expected]
    assert columns.next_offset == (max(start, log_end) if data else start)


def test_log_append_time_is_the_batch_max_timestamp_and_flagged():
    batch = build_batch([Record(b"k", b"v", (), 10), Record(b"k", b"v", (), 30)], timestamp_type=1)
    columns = decode_record_set(batch, 0, 10, None)
    assert columns.timestamps.tolist() == [30, 30]
    assert columns.log_append_time.tolist() == [True, True]
    assert columns.headers is None


def test_log_append_and_create_time_batches_in_one_answer_keep_their_own_timestamps():
    """walk.py repeats each batch's fields over its records; the log-append ones then take the batch's max."""
    create = bytearray(build_batch([Record(b"k", b"v", (), 10 + i) for i in range(40)]))
    log_append = bytearray(build_batch([Record(b"k", b"v", (), 500 + i) for i in range(30)], timestamp_type=1))
    set_base_offset(log_append, 0, 40)
    columns = decode_record_set(bytes(create + log_append), 0, 70, None)
    assert columns.offsets.tolist() == list(range(70))
    assert columns.timestamps.tolist() == [10 + i for i in range(40)] + [529] * 30
    assert columns.log_append_time.tolist() == [False] * 40 + [True] * 30


def test_read_uncommitted_keeps_aborted_records_and_drops_markers():
    data, aborted, _, _ = record_set([("txn", 1, [Record(b"k", b"aborted", (), 1)], "uncompressed"),
                                      ("end", 1, False)])
    assert aborted == [(1, 5)]
    columns = decode_record_set(data, 0, 100, None)
    assert columns.values.to_pylist() == [b"aborted"]
    assert columns.next_offset == 7


@pytest.mark.parametrize("damage", ["record length", "bytes left", "key length", "count and a length of -1",
                                    "negative count"])
def test_a_malformed_record_is_corrupt_message(damage):
    data = bytearray(build_batch([Record(b"key", b"value", (), 1)]))
    if damage == "record length":
        data[61] = 0x7E  # zigzag 63: runs past the batch
    elif damage == "count and a length of -1":  # a walk that stays in place, 2**31 - 1 times
        data[57:61] = (2**31 - 1).to_bytes(4, "big")
        data[61] = 0x01
    elif damage == "negative count":
        data[57:61] = (-1).to_bytes(4, "big", signed=True)
    elif damage == "bytes left":
        data[61] -= 2  # one byte shorter: the record ends before its header count
    else:
        data[61 + 1 + 1 + 1 + 1] = 0x7E  # length, attributes, timestamp delta, offset delta, then key length
    with pytest.raises(KafkaError, match="malformed"):
        decode_record_set(bytes(data), 0, 10, None)
