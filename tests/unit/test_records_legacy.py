"""Message format v0/v1 conversion, checked against kafka-python's own legacy record code."""

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from ottla.errors import ErrorCode, KafkaError
from ottla.records.legacy import down_convert, up_convert
from ottla.records.records import Record, build_batch, decode_batch
from ottla.records.batch import set_base_offset
from ottla.records.control import build_control_batch


def _legacy_set(magic: int, codec: int, count: int = 5) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i if magic else None,
                       key=None if i == 0 else f"k{i}".encode(), value=f"v{i}".encode())
    return bytes(builder.build())


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1, 2])  # none, gzip, snappy
def test_up_convert_keeps_keys_values_timestamps_and_codec(magic, codec):
    batch = up_convert(_legacy_set(magic, codec), now_ms=42, inflate_limit=1 << 25)
    records = decode_batch(batch)
    assert [(r.key, r.value) for r in records] == [(None, b"v0")] + [(f"k{i}".encode(), f"v{i}".encode())
                                                                     for i in range(1, 5)]
    assert [r.timestamp for r in records] == ([1_700_000_000_000 + i for i in range(5)] if magic else [42] * 5)
    assert batch[21 + 1] & 0x07 == codec  # attributes low byte: the producer's codec is kept


def test_up_convert_rejects_corruption_as_kafka_does():
    data = bytearray(_legacy_set(1, 0))
    data[-1] ^= 0xFF
    with pytest.raises(KafkaError) as failed:
        up_convert(bytes(data), now_ms=0, inflate_limit=1 << 25)
    assert failed.value.code == ErrorCode.corrupt_message
    with pytest.raises(KafkaError) as failed:
        up_convert(b"\x00" * 5, now_ms=0, inflate_limit=1 << 25)
    assert failed.value.code == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [0, 1])
def test_down_convert_is_read_back_by_kafka_python(magic):
    data = build_batch([Record(b"a", b"1", timestamp=10), Record(None, b"2", timestamp=11)], base_offset=7,
                       compression="gzip")
    marker = bytearray(build_control_batch(producer_id=1, epoch=0, coordinator_epoch=0, commit=True, timestamp=12))
    set_base_offset(marker, 0, 9)
    data += bytes(marker)  # a transaction marker has no v0/v1 form: left out
    data += build_batch([Record(b"c", b"3", timestamp=13)], base_offset=10)
    converted = down_convert(data + data[:30], magic)  # a torn tail is dropped
    records = MemoryRecords(converted)
    got = []
    while (batch := records.next_batch()) is not None:
        assert batch.magic == magic
        got += [(r.offset, r.key, r.value, r.timestamp) for r in batch]
    expected_ts = [10, 11, 13] if magic else [None, None, None]
    assert got == [(7, b"a", b"1", expected_ts[0]), (8, None, b"2", expected_ts[1]), (10, b"c", b"3", expected_ts[2])]
