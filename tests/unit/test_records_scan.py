"""`scan_batches`, the lean walk the coordinators load with, reads what `iter_batches` reads
(offset, key, value; batch offsets, attributes, producer id) and refuses what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ottla.errors import ErrorCode, KafkaError
from ottla.records.batch import HEADER_SIZE
from ottla.records.records import Record, build_batch, iter_batches
from ottla.records.scan import scan_batches

_record = st.tuples(st.one_of(st.none(), st.binary(max_size=80), st.binary(min_size=200, max_size=400)),
                    st.one_of(st.none(), st.binary(max_size=10), st.binary(min_size=60, max_size=3000)),
                    st.lists(st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=5))), max_size=2))
_batch = st.tuples(st.lists(_record, min_size=1, max_size=20), st.sampled_from(["uncompressed", "gzip", "zstd"]),
                   st.booleans(), st.integers(-1, 1 << 40))


def _record_set(batches) -> bytes:
    out, offset = b"", 0
    for records, codec, transactional, producer_id in batches:
        out += build_batch([Record(k, v, tuple(h), 1_000 + i * 1_000_003) for i, (k, v, h) in enumerate(records)],
                           base_offset=offset, compression=codec, is_transactional=transactional,
                           producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1)
        offset += len(records) + 3
    return out


def _decoded(data: bytes):
    return [(h.base_offset, h.last_offset, h.attributes, h.producer_id, [(r.offset, r.key, r.value) for r in records])
            for h, records in iter_batches(data)]


@settings(max_examples=100, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=6), st.integers(0, 200))
def test_scan_reads_what_iter_batches_reads(batches, torn):
    data = _record_set(batches)
    assert list(scan_batches(data)) == _decoded(data)
    # A torn tail (a log read cut mid-batch) is ignored by both.
    cut = data[:max(len(data) - torn, 0)]
    assert list(scan_batches(cut)) == _decoded(cut)


@settings(max_examples=100, deadline=None)
@given(st.lists(_record, min_size=1, max_size=8), st.data())
def test_a_malformed_record_is_corrupt_message_for_both(records, data):
    batch = bytearray(_record_set([(records, "uncompressed", False, -1)]))
    position = data.draw(st.integers(HEADER_SIZE, len(batch) - 1))
    batch[position] = data.draw(st.integers(0, 255))
    try:
        expected = _decoded(bytes(batch))
    except KafkaError as exc:
        assert exc.code == ErrorCode.corrupt_message
        with pytest.raises(KafkaError) as refused:
            list(scan_batches(bytes(batch)))
        assert refused.value.code == ErrorCode.corrupt_message
    else:
        assert list(scan_batches(bytes(batch))) == expected


def test_a_record_past_its_batch_is_corrupt_message():
    batch = bytearray(build_batch([Record(b"k", b"v" * 10, (), 1)]))
    batch[HEADER_SIZE] = 0x7E  # record length 63: past the end of the batch
    with pytest.raises(KafkaError) as refused:
        list(scan_batches(bytes(batch)))
    assert refused.value.code == ErrorCode.corrupt_message


def _plain(attributes: int) -> bool:
    return not attributes & 0x37  # uncompressed, not transactional, not control


@settings(max_examples=100, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=6), st.integers(0, 200))
def test_plain_batches_go_by_key_into_the_dict(batches, torn):
    """What the group coordinator's load takes from each plain batch: the last record per key,
    by offset; every other batch is yielded as without the dict."""
    data = _record_set(batches)
    for cut in (data, data[:max(len(data) - torn, 0)]):
        decoded = _decoded(cut)
        latest = {}
        yielded = list(scan_batches(cut, plain_into=latest))
        assert yielded == [batch for batch in decoded if not _plain(batch[2])]
        expected = {}
        for batch in decoded:
            if _plain(batch[2]):
                expected.update({key: (offset, value) for offset, key, value in batch[4] if key is not None})
        assert latest == expected


def _check_mutated_pair(records, position: int, value: int) -> None:
    """Two plain batches, one byte of them changed: `scan_batches` with the dict refuses what
    `iter_batches` refuses, with the same error, and otherwise yields the batches that are no
    longer plain and stores only the plain ones' keyed records."""
    batch = bytearray(_record_set([(records, "uncompressed", False, -1)] * 2))
    batch[position] = value
    try:
        expected = _decoded(bytes(batch))
    except KafkaError as exc:
        assert exc.code in (ErrorCode.corrupt_message, ErrorCode.unsupported_compression_type)
        with pytest.raises(KafkaError) as refused:
            list(scan_batches(bytes(batch), plain_into={}))
        assert refused.value.code == exc.code
    else:
        latest = {}
        assert list(scan_batches(bytes(batch), plain_into=latest)) == [b for b in expected if not _plain(b[2])]
        assert latest == {k: (o, v) for b in expected if _plain(b[2]) for o, k, v in b[4] if k is not None}


@settings(max_examples=100, deadline=None)
@given(st.lists(_record, min_size=1, max_size=8), st.data())
def test_a_malformed_plain_batch_is_refused_as_iter_batches_refuses_it(records, data):
    """The mutation may land in the second batch's header: an unknown codec in its attributes is
    UNSUPPORTED_COMPRESSION_TYPE for both, anything else malformed CORRUPT_MESSAGE; a
    transactional or control bit makes it a batch that is yielded, not stored."""
    length = len(_record_set([(records, "uncompressed", False, -1)] * 2))
    _check_mutated_pair(records, data.draw(st.integers(HEADER_SIZE, length - 1)), data.draw(st.integers(0, 255)))


def test_every_single_byte_change_of_two_small_batches():
    """All 256 values at every position past the first header: the property above meets the
    rare header changes only by luck (an unknown codec in the second batch's attributes failed
    one CI run; its transactional or control bit is rarer still), here every run checks them."""
    records = [(b"k", b"v", [("h", b"x")])]
    length = len(_record_set([(records, "uncompressed", False, -1)] * 2))
    failed = []
    for position in range(HEADER_SIZE, length):
        for value in range(256):
            try:
                _check_mutated_pair(records, position, value)
            except AssertionError:
                failed.append((position, value))
    assert failed == []
