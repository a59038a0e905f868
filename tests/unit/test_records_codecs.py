"""Codecs and record (de)coding, checked against kafka-python's real client implementation."""

import struct

import cramjam
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ottla.errors import ErrorCode, KafkaError
from ottla.producer_state.markers import read_end_txn_marker
from ottla.records import compression
from ottla.records.batch import compute_crc, parse_batches
from ottla.records.control import ABORT, COMMIT, build_control_batch, control_type, parse_control_batch
from ottla.records.records import Record, build_batch, decode_batch, decode_varint, encode_varint, iter_batches

CODECS = {
    compression.NONE: None,
    compression.GZIP: None,
    compression.SNAPPY: "snappy",
    compression.LZ4: "lz4.frame",
    compression.ZSTD: "zstandard",
}


def kafka_python_batch(codec, n=20):
    """kafka-python needs python-snappy / lz4 / zstandard (test extras) to produce those codecs."""
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for i in range(n):
        headers = [("trace", f"t{i}".encode()), ("empty", None)] if i % 2 else []
        builder.append(i, 5_000 + i, None if i == 3 else f"key-{i}".encode(), (b"payload %d " % i) * 50, headers)
    return bytes(builder.build())


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_decode_batches_from_a_real_client(codec):
    data = kafka_python_batch(codec)
    [h] = parse_batches(data)
    assert h.compression == codec
    records = decode_batch(data, h)
    assert [r.offset for r in records] == list(range(20))
    assert [r.timestamp for r in records] == [5_000 + i for i in range(20)]
    assert records[3].key is None and records[4].key == b"key-4"
    assert records[7].value == b"payload 7 " * 50
    assert records[1].headers == (("trace", b"t1"), ("empty", None))
    assert records[2].headers == ()


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_real_client_reads_our_batches(codec):
    records = [Record(b"k%d" % i, b"v" * i * 30, (("h", b"%d" % i),), 100 + i) for i in range(10)]
    data = build_batch(records, base_offset=50, compression=codec)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc() and batch.compression_type == codec
    read = list(batch)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in read] == [
        (50 + i, 100 + i, b"k%d" % i, b"v" * i * 30) for i in range(10)
    ]
    assert read[4].headers == [("h", b"4")]


def test_snappy_xerial_and_raw_both_decode():
    payload = bytes(range(256)) * 500
    raw = bytes(cramjam.snappy.compress_raw(payload))
    blocks = [payload[i : i + 32768] for i in range(0, len(payload), 32768)]
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        compressed = bytes(cramjam.snappy.compress_raw(block))
        framed += struct.pack(">i", len(compressed)) + compressed
    assert compression.decompress(compression.SNAPPY, raw) == payload
    assert compression.decompress(compression.SNAPPY, framed) == payload
    with pytest.raises(KafkaError) as e:
        compression.decompress(compression.SNAPPY, framed[:-10])
    assert e.value.code == ErrorCode.corrupt_message


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD])
def test_codec_round_trip_and_garbage(codec):
    payload = b"the quick brown fox " * 1000
    assert compression.decompress(codec, compression.compress(codec, payload)) == payload
    with pytest.raises(KafkaError) as e:
        compression.decompress(codec, b"\x00garbage that is not a compressed stream")
    assert e.value.code == ErrorCode.corrupt_message


def test_unknown_codec():
    with pytest.raises(KafkaError) as e:
        compression.decompress(6, b"")
    assert e.value.code == ErrorCode.unsupported_compression_type


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 300, -300, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
def test_varint_round_trip(value):
    out = bytearray()
    encode_varint(value, out)
    assert decode_varint(out, 0) == (value, len(out))


def test_malformed_records_are_corrupt():
    data = bytearray(build_batch([Record(b"k", b"v" * 20, (), 1)]))
    data[61] = 0x7E  # record length varint now claims 63 bytes
    struct.pack_into(">I", data, 17, compute_crc(data, 0, len(data)))
    with pytest.raises(KafkaError) as e:
        decode_batch(data)
    assert e.value.code == ErrorCode.corrupt_message


def test_iter_batches_skips_a_torn_tail():
    a = build_batch([Record(b"a", b"1", (), 1)], base_offset=0)
    b = build_batch([Record(b"b", b"2", (), 2), Record(b"c", b"3", (), 3)], base_offset=1)
    decoded = list(iter_batches(a + b + b[:20]))
    assert [[r.key for r in records] for _, records in decoded] == [[b"a"], [b"b", b"c"]]


def test_log_append_time_batch_gives_every_record_the_batch_time():
    data = build_batch([Record(b"a", b"1", (), 1), Record(b"b", b"2", (), 5)], timestamp_type=1)
    assert [r.timestamp for r in decode_batch(data)] == [5, 5]


@pytest.mark.parametrize("commit", [True, False])
def test_control_batch(commit):
    data = build_control_batch(producer_id=77, epoch=4, coordinator_epoch=12, commit=commit, timestamp=123)
    [h] = parse_batches(data)
    assert h.is_control and h.is_transactional and h.records_count == 1
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.max_timestamp) == (77, 4, -1, 123)
    marker = parse_control_batch(data, h)
    assert marker.commit is commit and marker.coordinator_epoch == 12
    assert control_type(decode_batch(data, h)[0].key) == (COMMIT if commit else ABORT)
    assert read_end_txn_marker(data, h) == marker  # what the log hands to producer state
    assert DefaultRecordBatch(data).is_control_batch


def test_control_record_key_too_short():
    with pytest.raises(KafkaError) as e:
        control_type(b"\x00")
    assert e.value.code == ErrorCode.corrupt_message


def test_build_batch_takes_codec_names():
    [h] = parse_batches(build_batch([Record(b"k", b"v" * 100, (), 1)], compression="lz4"))
    assert h.compression == compression.LZ4
    [h] = parse_batches(build_batch([Record(b"k", b"v", (), 1)], compression=None))
    assert h.compression == compression.NONE
