"""Message format v0/v1 conversion, checked against kafka-python's own legacy record code."""

import asyncio

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from ottla.errors import ErrorCode, KafkaError
from ottla.records.legacy import GROUP_BYTES, LazyDownConversion, down_convert, down_converted, up_convert, walked
from ottla.records.records import Record, build_batch, decode_batch
from ottla.records.batch import set_base_offset
from ottla.records.control import build_control_batch
from ottla.records.validator import key_value_sizes


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


def _mixed_log() -> bytes:
    """Batches of every kind a log holds, about 2 MB: plain and compressed, null keys and
    values, headers (dropped by the conversion), LogAppendTime, a transaction marker, one
    batch larger than a conversion group and many small ones."""
    data = bytearray()
    offset = 0

    def add(records, **kwargs):
        nonlocal offset
        data.extend(build_batch(records, base_offset=offset, **kwargs))
        offset += len(records)
    add([Record(b"k", b"v" * 100, (("h", b"x"),), 1)] * 2000)
    add([Record(None, None, (), 2)] * 300, compression="gzip")
    add([Record(b"big", bytes(range(256)) * 300, (), 3)] * 4)  # 300 KB: sent as groups of its records
    add([Record(b"huge", bytes(range(256)) * 400, (), 3)] * 12)  # 1.2 MB: larger than one read of the walk
    add([Record(f"k{i}".encode(), b"z" * i * 3, (), 4 + i) for i in range(500)], compression="zstd",
        timestamp_type=1, now_ms=99)  # 50 KB inflating to 390 KB
    marker = bytearray(build_control_batch(producer_id=1, epoch=0, coordinator_epoch=0, commit=True, timestamp=5))
    set_base_offset(marker, 0, offset)
    data.extend(marker)
    offset += 1
    for i in range(3000):
        add([Record(None, b"%d" % i, (), 6)])
    return bytes(data)


def _walked(source, magic: int, turns: list | None = None) -> LazyDownConversion:
    async def turn():
        if turns is not None:
            turns.append(1)
    return asyncio.run(walked(source, magic, turn))


def _down_converted(source, magic: int):
    async def turn():
        pass
    return asyncio.run(down_converted(source, magic, turn))


class _InAFile:
    """A FileRecords' reading side, counting what is read."""

    def __init__(self, data: bytes):
        self.data = data
        self.largest_read = 0

    def __len__(self):
        return len(self.data)

    def read(self, start: int, length: int) -> bytes:
        self.largest_read = max(self.largest_read, length)
        return self.data[start:start + length]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("in_file", [False, True])
def test_lazy_down_conversion_sends_exactly_what_converting_at_once_does(magic, in_file):
    data = _mixed_log()
    source = _InAFile(data) if in_file else memoryview(data)
    lazy = _walked(source, magic)
    eager = down_convert(data, magic)
    assert len(lazy) == len(eager)
    sent = [lazy.convert(data[start:end], group) for group in lazy.groups for start, end, *_ in [group]]
    assert b"".join(sent) == eager
    # What one unread response holds at a time: a group of at most GROUP_BYTES and one
    # message; the 300 KB batch and the zstd one of 500 records went by their records.
    assert max(len(piece) for piece in sent) < GROUP_BYTES + 110_000
    assert sum(1 for group in lazy.groups if group[3] >= 0) >= 3
    assert len(lazy.groups) >= 5
    if in_file:
        assert source.largest_read < 1_300_000  # the walk reads a piece at a time, or one batch
    # ... and the handler gives the event loop a turn after each piece it read.
    turns: list = []
    _walked(source, magic, turns)
    assert len(turns) >= len(data) >> 20
    # A torn tail is dropped as down_convert drops it; a short answer is converted at once.
    assert len(_walked(data + data[:100], magic)) == len(eager)
    small = data[:2000]
    assert _down_converted(small, magic) == down_convert(small, magic)
    assert isinstance(_down_converted(data, magic), LazyDownConversion)


def test_lazy_down_conversion_refuses_a_malformed_batch_and_a_changed_source():
    batch = bytearray(build_batch([Record(b"k", b"v", (), 1)] * 3))
    batch[60] = 4  # the header's record count: one record more than the batch holds
    with pytest.raises(KafkaError) as failed:
        _walked(bytes(batch), 1)
    assert failed.value.code == ErrorCode.corrupt_message
    data = build_batch([Record(b"k", b"v", (), 1)] * 3)
    lazy = _walked(data, 1)
    with pytest.raises(ValueError):
        lazy.convert(build_batch([Record(b"k", b"vv", (), 1)] * 3), lazy.groups[0])


def test_many_records_are_sized_by_numpy_as_decoding_them_would():
    records = [Record(None if i % 7 == 0 else b"k" * (i % 50), None if i % 11 == 0 else b"v" * (i * 37 % 3000),
                      (("h", b"x" * (i % 3)),) if i % 5 == 0 else (), 1) for i in range(400)]
    batch = build_batch(records)
    sizes = key_value_sizes(batch[61:], len(records))  # the records after the 61-byte header
    assert sizes is not None  # the fast path, not the record-by-record walk
    assert sizes[0].tolist() == [len(r.key or b"") for r in records]
    assert sizes[1].tolist() == [len(r.value or b"") for r in records]
    assert key_value_sizes(batch[61:], 399) is None  # a count the records do not match: left to the walk


def test_a_batch_sent_by_groups_of_its_records_is_decompressed_once_per_response(tmp_path, monkeypatch):
    """A compressed batch converting to many groups: decompressed once by the walk and once
    by the connection sending its groups (it was once per group: 32 MiB, 128 times), and the
    bytes sent are still those of a conversion at once."""
    from ottla.config import BrokerConfig
    from ottla.records import legacy
    from ottla.server.broker import Broker
    from ottla.server.network import Connection
    from tests.unit.test_disk_work_off_loop import draining_peer

    batch = build_batch([Record(b"k%d" % i, bytes([i % 256]) * 1000, (), 1) for i in range(2000)], compression="zstd")
    ours, received, reader = draining_peer()
    decompressed: list[int] = []
    real = legacy.decompress

    def counted(codec, data):
        decompressed.append(codec)
        return real(codec, data)
    monkeypatch.setattr(legacy, "decompress", counted)

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            lazy = await down_converted(batch, 1, lambda: asyncio.sleep(0))  # as the Fetch v3 handler does
            assert len(lazy.groups) >= 7 and all(group[3] >= 0 for group in lazy.groups)
            _, connection = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
            await connection._send([lazy])
            connection.close()
            await asyncio.sleep(0)
        finally:
            broker.logs.close()
            broker.release_data_dir()

    asyncio.run(scenario())
    reader.join(30)
    assert len(decompressed) <= 2
    assert bytes(received) == down_convert(batch, 1)
