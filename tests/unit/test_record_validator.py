"""F5/F6 (issue 11): produced batches whose header and CRC are fine but whose records are not
are refused as Kafka's LogValidator refuses them, and a compressed batch never inflates past a
bound derived from max.message.bytes. Hypothesis checks the walk against the real decoder."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from ottla.config import BrokerConfig, TopicConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log import Log
from ottla.records import compression
from ottla.records.batch import CRC_START, HEADER, HEADER_SIZE, LOG_OVERHEAD, read_header
from ottla.records.records import Record, build_batch, decode_batch, encode_varint
from ottla.records.validator import check_records, inflate_limit

E = ErrorCode

# The poison pill: a valid header and CRC, one declared record, twelve bytes of garbage.
F5_BATCH = bytes.fromhex(
    "00000000000000000000003dffffffff02f1a982a5000000000000000001a2086868a1000001a2086868a1"
    "ffffffffffffffffffffffffffff00000001ffffffffffffffffffffffff")


def log_for(tmp_path, **configs):
    return Log(tmp_path / "t-0", TopicConfig(BrokerConfig(), configs))


def code_of(excinfo):
    return excinfo.value.code


def with_header(batch: bytes, *, records_count=None, last_offset_delta=None, body: bytes | None = None,
                attributes=None) -> bytes:
    """The batch with some header fields or its records section replaced and the CRC made valid."""
    fields = list(HEADER.unpack_from(batch, 0))
    body = batch[HEADER_SIZE:] if body is None else body
    fields[1] = HEADER_SIZE + len(body) - LOG_OVERHEAD
    if attributes is not None:
        fields[5] = attributes
    if last_offset_delta is not None:
        fields[6] = last_offset_delta
    if records_count is not None:
        fields[12] = records_count
    out = bytearray(HEADER.pack(*fields) + body)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def raw_record(offset_delta=0, key=b"k", value=b"v", headers=(), length_adjust=0) -> bytes:
    body = bytearray(b"\x00")
    encode_varint(0, body)
    encode_varint(offset_delta, body)
    for field in (key, value):
        if field is None:
            encode_varint(-1, body)
        else:
            encode_varint(len(field), body)
            body += field
    encode_varint(len(headers), body)
    for name, header_value in headers:
        encode_varint(len(name), body)
        body += name
        encode_varint(len(header_value), body)
        body += header_value
    out = bytearray()
    encode_varint(len(body) + length_adjust, out)
    return bytes(out + body)


def test_f5_garbage_records_are_invalid_record_and_not_stored(tmp_path):
    log = log_for(tmp_path)
    assert read_header(F5_BATCH).records_count == 1  # header and CRC are valid
    with pytest.raises(KafkaError) as excinfo:
        log.append(F5_BATCH, now_ms=0x1A2086868A1)
    assert code_of(excinfo) is E.invalid_record
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_f6_a_batch_claiming_more_records_than_it_holds_is_refused(tmp_path):
    log = log_for(tmp_path)
    one = build_batch([Record(b"k", b"v", (), 1_000)])
    liar = with_header(one, records_count=2**31 - 1, last_offset_delta=2**31 - 2)
    with pytest.raises(KafkaError) as excinfo:
        log.append(liar, now_ms=1_000)
    assert code_of(excinfo) is E.invalid_record
    assert log.log_end_offset == 0
    assert log.append(one, now_ms=1_000).last_offset == 0  # the partition still takes good batches


@pytest.mark.parametrize("records, count", [
    ([raw_record(0), raw_record(1)], 1),                        # records still remaining
    ([raw_record(0)], 2),                                       # premature end
    ([raw_record(0), raw_record(0)], 2),                        # offset deltas must count up
    ([raw_record(0, length_adjust=1)], 1),                      # length runs past the batch
    ([raw_record(0, length_adjust=-1), b"\x00"], 1),            # length shorter than the fields
    ([raw_record(0, key=b"k" * 300)[:-150]], 1),                 # key runs past the record
    ([raw_record(0, headers=((b"h", b"x"),))[:-2] + b"\x05\x00"], 1),  # header value of length -3
    ([b"\xff\xff\xff\xff\xff\xff"], 1),                          # varint too long
])
def test_malformed_records_are_invalid_record(tmp_path, records, count):
    batch = with_header(build_batch([Record(b"k", b"v", (), 1_000)]), records_count=count,
                        last_offset_delta=count - 1, body=b"".join(records))
    with pytest.raises(KafkaError) as excinfo:
        log_for(tmp_path).append(batch, now_ms=1_000)
    assert code_of(excinfo) is E.invalid_record


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_payload_that_does_not_inflate_is_corrupt_message(tmp_path, codec):
    good = build_batch([Record(b"k", b"v" * 50, (), 1_000)] * 3, compression=codec)
    body = bytearray(good[HEADER_SIZE:])
    body[len(body) // 2:] = b"\xa5" * (len(body) - len(body) // 2)
    with pytest.raises(KafkaError) as excinfo:
        log_for(tmp_path).append(with_header(good, body=bytes(body)), now_ms=1_000)
    assert code_of(excinfo) is E.corrupt_message


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_with_valid_records_pass(tmp_path, codec):
    records = [Record(b"k%d" % i, b"v" * i, (("h", b"x" * i),), 1_000 + i) for i in range(200)]
    log = log_for(tmp_path)
    assert log.append(build_batch(records, compression=codec), now_ms=1_000).last_offset == 199


def _gzip_bomb(size: int) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    parts = [deflate.compress(chunk) for _ in range(size >> 20)]
    return b"".join(parts) + deflate.flush()


def test_a_gzip_bomb_is_refused_without_inflating_it(tmp_path):
    """The issue's bomb: about 1 MB of gzip inflating to 1 GiB, produced to a topic that
    recompresses. It is MESSAGE_TOO_LARGE, and no more than the bound is ever allocated."""
    body = _gzip_bomb(1 << 30)
    bomb = with_header(build_batch([Record(b"k", b"v", (), 1_000)]), body=body, attributes=compression.GZIP)
    log = log_for(tmp_path, **{"compression.type": "lz4", "max.message.bytes": 2 << 20})
    rss_before = _reset_peak_rss()
    tracemalloc.start()
    try:
        with pytest.raises(KafkaError) as excinfo:
            log.append(bomb, now_ms=1_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code_of(excinfo) is E.message_too_large
    assert peak <= inflate_limit(2 << 20) + (8 << 20)
    # Large output buffers are anonymous mappings, which tracemalloc does not see: the
    # process's peak RSS does.
    assert _status_bytes("VmHWM") - rss_before <= inflate_limit(2 << 20) + (16 << 20)
    assert log.log_end_offset == 0


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def _reset_peak_rss() -> int:
    """Start VmHWM over from the current RSS (Linux: clear_refs 5); the RSS now."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status_bytes("VmRSS")


def test_cramjam_still_says_output_full_in_the_words_we_match():
    with pytest.raises(cramjam.DecompressionError, match=compression._OUTPUT_FULL):
        cramjam.zstd.decompress_into(cramjam.zstd.compress(bytes(1000)), bytearray(10))


_records = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=200)), st.one_of(st.none(), st.binary(max_size=300)),
                              st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=20)), max_size=3)),
                    min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(_records, st.sampled_from(["uncompressed", "gzip", "lz4"]))
def test_well_formed_batches_always_pass(records, codec):
    batch = build_batch([Record(k, v, tuple(h), 1_000) for k, v, h in records], compression=codec)
    check_records(batch, read_header(batch), 1 << 20)


@settings(max_examples=300, deadline=None)
@given(_records, st.data())
def test_the_walk_agrees_with_the_decoder_on_mutated_records(records, data):
    """A mutated records section passes the walk only if the full decoder reads it too (with
    the same count), so nothing the walk lets through is a poison pill for a consumer."""
    batch = bytearray(build_batch([Record(k, v, tuple(h), 1_000) for k, v, h in records]))
    position = data.draw(st.integers(HEADER_SIZE, len(batch) - 1))
    batch[position] = data.draw(st.integers(0, 255))
    header = read_header(batch)
    try:
        check_records(batch, header, 1 << 20)
    except KafkaError:
        return
    try:
        decoded = decode_batch(batch, header)
    except KafkaError as exc:
        # Header keys are not checked for UTF-8: Kafka's reader decodes them with replacement
        # characters and accepts the batch; our strict decoder is the only one that minds.
        assert "utf-8" in str(exc)
        return
    assert [r.offset for r in decoded] == list(range(header.records_count))
