"""Record batch v2 header parsing, Kafka's validation codes and in-place patching."""

import struct

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ottla.errors import ErrorCode, KafkaError
from ottla.records.batch import (
    HEADER_SIZE,
    BatchHeader,
    compute_crc,
    parse_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_client_batch,
)
from ottla.records.records import Record, build_batch


def client_batch(n=3, *, producer_id=-1, epoch=-1, base_sequence=-1, transactional=False, codec=0, ts=1_000):
    """A batch built by kafka-python's producer code, i.e. what a real client sends."""
    builder = DefaultRecordBatchBuilder(2, codec, transactional, producer_id, epoch, base_sequence, 1 << 20)
    for i in range(n):
        builder.append(i, ts + i, f"k{i}".encode(), f"value-{i}".encode() * 10, [("h", b"x")])
    return bytes(builder.build())


def code_of(excinfo):
    return excinfo.value.code


def test_header_fields_of_a_client_batch():
    data = client_batch(5, producer_id=42, epoch=3, base_sequence=7, transactional=True)
    [h] = parse_batches(data)
    assert isinstance(h, BatchHeader)
    assert (h.position, h.base_offset, h.magic) == (0, 0, 2)
    assert h.size == len(data) == h.batch_length + 12
    assert (h.records_count, h.last_offset_delta, h.last_offset) == (5, 4, 4)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (42, 3, 7, 11)
    assert h.is_transactional and not h.is_control and h.has_producer_id
    assert (h.first_timestamp, h.max_timestamp, h.timestamp_type, h.compression) == (1000, 1004, 0, 0)


def test_several_batches_report_their_positions():
    a, b = client_batch(2), client_batch(4)
    headers = parse_batches(a + b)
    assert [h.position for h in headers] == [0, len(a)]
    assert [h.records_count for h in headers] == [2, 4]


def test_last_sequence_wraps_at_int32_max():
    data = bytearray(client_batch(5, producer_id=1, epoch=0, base_sequence=2**31 - 3))
    [h] = parse_batches(data)
    assert h.last_sequence == 1  # MAX-2, MAX-1, MAX, 0, 1
    [h] = parse_batches(client_batch(1))
    assert h.last_sequence == -1 and not h.has_producer_id


def test_empty_record_set_is_invalid_record():
    with pytest.raises(KafkaError) as e:
        parse_batches(b"")
    assert code_of(e) == ErrorCode.invalid_record


@pytest.mark.parametrize("cut", [5, 17, 40, HEADER_SIZE, -1])
def test_truncated_batch_is_corrupt(cut):
    data = client_batch()
    with pytest.raises(KafkaError) as e:
        parse_batches(data[:cut])
    assert code_of(e) == ErrorCode.corrupt_message


def test_trailing_torn_batch_is_corrupt():
    data = client_batch() + client_batch()[:30]
    with pytest.raises(KafkaError) as e:
        parse_batches(data)
    assert code_of(e) == ErrorCode.corrupt_message


def test_bad_crc_is_corrupt():
    data = bytearray(client_batch())
    data[-1] ^= 0xFF
    with pytest.raises(KafkaError) as e:
        parse_batches(data)
    assert code_of(e) == ErrorCode.corrupt_message


def test_length_field_smaller_than_a_header_is_corrupt():
    data = bytearray(client_batch())
    struct.pack_into(">i", data, 8, 10)
    with pytest.raises(KafkaError) as e:
        parse_batches(data)
    assert code_of(e) == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_is_invalid_record_as_kafka_answers_produce_v3_and_later(magic):
    data = bytearray(client_batch())
    data[16] = magic
    with pytest.raises(KafkaError) as e:
        parse_batches(data)
    assert code_of(e) == ErrorCode.invalid_record


def test_unknown_magic_is_corrupt():
    data = bytearray(client_batch())
    data[16] = 3
    with pytest.raises(KafkaError) as e:
        parse_batches(data)
    assert code_of(e) == ErrorCode.corrupt_message


def test_batch_over_max_message_bytes():
    data = client_batch()
    parse_batches(data, max_batch_bytes=len(data))
    with pytest.raises(KafkaError) as e:
        parse_batches(data, max_batch_bytes=len(data) - 1)
    assert code_of(e) == ErrorCode.message_too_large


def _with_header(data, fmt, offset, value):
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return buf


@pytest.mark.parametrize(
    "fmt,offset,value",
    [
        (">q", 0, 5),  # base offset must be 0 from a producer
        (">i", 57, 0),  # record count 0
        (">i", 57, 2),  # count disagrees with last offset delta (2)
        (">i", 23, -1),  # negative offset delta
        (">h", 21, 0x20),  # control bit
        (">i", 53, -1),  # producer id set but no sequence
    ],
)
def test_client_batch_rules_are_invalid_record(fmt, offset, value):
    data = client_batch(3, producer_id=9, epoch=0, base_sequence=0)
    [h] = parse_batches(_with_header(data, fmt, offset, value))
    with pytest.raises(KafkaError) as e:
        validate_client_batch(h)
    assert code_of(e) == ErrorCode.invalid_record


def test_valid_client_batch_passes():
    [h] = parse_batches(client_batch(3, producer_id=9, epoch=0, base_sequence=0))
    validate_client_batch(h)


def test_offset_and_epoch_patches_keep_the_crc_valid():
    data = bytearray(client_batch() * 2)
    headers = parse_batches(data)
    set_base_offset(data, headers[1].position, 1234)
    set_partition_leader_epoch(data, headers[1].position, 17)
    patched = parse_batches(data)[1]
    assert (patched.base_offset, patched.partition_leader_epoch, patched.last_offset) == (1234, 17, 1236)
    batch = DefaultRecordBatch(bytes(data[patched.position :]))
    assert batch.validate_crc()
    assert [r.offset for r in batch] == [1234, 1235, 1236]


def test_log_append_time_patch_recomputes_crc_and_readers_see_it():
    data = bytearray(client_batch(3, ts=1_000))
    [h] = parse_batches(data)
    set_log_append_time(data, 0, h.size, 99_999)
    [p] = parse_batches(data)  # raises if the CRC were stale
    assert (p.timestamp_type, p.max_timestamp, p.first_timestamp) == (1, 99_999, 1_000)
    assert p.crc == crc32c(bytes(data[21:]))
    batch = DefaultRecordBatch(bytes(data))
    assert batch.timestamp_type == 1
    assert [r.timestamp for r in batch] == [99_999] * 3


def test_build_batch_matches_header_contract():
    data = build_batch(
        [Record(b"a", b"1", (), 10), Record(None, b"2", (), 30), Record(b"c", None, (), 20)],
        base_offset=100,
        producer_id=5,
        producer_epoch=2,
        base_sequence=9,
        is_transactional=True,
    )
    [h] = parse_batches(data)
    assert (h.base_offset, h.last_offset, h.records_count) == (100, 102, 3)
    assert (h.first_timestamp, h.max_timestamp) == (10, 30)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional) == (5, 2, 9, True)
    assert h.partition_leader_epoch == -1
