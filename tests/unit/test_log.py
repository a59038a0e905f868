"""Log: offsets, reads, rolling, configs, producer state, truncation, flush and clean reopen."""

import os

import pytest
from kafka.record.default_records import DefaultRecordBatch

from ottla.config import BrokerConfig, TopicConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log import Log
from ottla.records.batch import parse_batches
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch, decode_batch, iter_batches


def config(**overrides):
    return TopicConfig(BrokerConfig(), {k.replace("_", "."): v for k, v in overrides.items()})


def batch(n=1, *, ts=1_000, value=b"v" * 100, key=b"k", producer_id=-1, epoch=-1, seq=-1, txn=False, codec=0):
    return build_batch(
        [Record(key, value, (), ts + i) for i in range(n)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=txn,
        compression=codec,
    )


def offsets_in(data):
    return [r.offset for _, records in iter_batches(data) for r in records]


@pytest.fixture
def log(tmp_path):
    return Log(tmp_path / "topic-0", config())


def test_append_assigns_dense_offsets(log):
    results = [log.append(batch(n), now_ms=5) for n in (1, 3, 2)]
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 0), (1, 3), (4, 5)]
    assert all(r.log_append_time == -1 and r.log_start_offset == 0 and not r.duplicate for r in results)
    assert log.log_end_offset == 6 and log.high_watermark == 0  # appends never move the HW
    assert log.update_high_watermark(10) == 6  # and it never passes the log end
    data = log.read(0, 1 << 20, max_offset=log.high_watermark).records
    assert offsets_in(data) == list(range(6))
    assert [h.partition_leader_epoch for h in parse_batches(data)] == [0, 0, 0]


def test_append_writes_the_client_bytes_unchanged_except_the_patches(log):
    log.append(batch(1), now_ms=0)
    sent = bytearray(batch(2, ts=77))
    log.append(bytes(sent), now_ms=0, leader_epoch=9)
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    stored = log.read(1, 1 << 20, max_offset=log.high_watermark).records
    assert stored[12:16] == (9).to_bytes(4, "big") and stored[:8] == (1).to_bytes(8, "big")
    assert stored[16:] == sent[16:]  # from magic on, byte for byte, CRC included


def test_read_from_the_middle_of_a_batch_returns_the_whole_batch(log):
    log.append(batch(5), now_ms=0)
    log.append(batch(5), now_ms=0)
    assert offsets_in(log.read(7, 1 << 20, max_offset=10).records) == [5, 6, 7, 8, 9]


def test_read_respects_max_offset_and_max_bytes(log):
    for _ in range(10):
        log.append(batch(2), now_ms=0)
    size = len(batch(2))
    assert offsets_in(log.read(0, 1 << 20, max_offset=6).records) == list(range(6))
    assert offsets_in(log.read(0, 1 << 20, max_offset=5).records) == list(range(4))  # batch 4-5 reaches 5
    assert offsets_in(log.read(0, 3 * size + 10, max_offset=20).records) == list(range(6))
    assert log.read(6, 1 << 20, max_offset=6).records == b""


def test_min_one_batch_returns_a_batch_larger_than_max_bytes(log):
    log.append(batch(1, value=b"x" * 10_000), now_ms=0)
    assert offsets_in(log.read(0, 100, max_offset=1).records) == [0]
    assert log.read(0, 100, max_offset=1, min_one_batch=False).records == b""
    assert log.read(0, 10, max_offset=1).records  # even below one header


def test_read_out_of_range(log):
    log.append(batch(3), now_ms=0)
    assert log.read(3, 100, max_offset=3).records == b""  # at the LEO: empty, not an error
    for bad in (-1, 4):
        with pytest.raises(KafkaError) as e:
            log.read(bad, 100, max_offset=3)
        assert e.value.code == ErrorCode.offset_out_of_range


def test_roll_happens_before_the_append_that_would_overflow(tmp_path):
    size = len(batch(1))
    log = Log(tmp_path / "t-0", config(segment_bytes=3 * size))
    for _ in range(7):
        log.append(batch(1), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert [s.size for s in log.segments] == [3 * size, 3 * size, size]
    names = sorted(os.listdir(tmp_path / "t-0"))
    assert "00000000000000000003.log" in names and "00000000000000000006.index" in names
    # sealed segments keep no preallocated index space
    assert os.path.getsize(tmp_path / "t-0" / "00000000000000000000.index") == 0
    # a read that starts in one segment stops at its end; the next read continues
    assert offsets_in(log.read(1, 1 << 20, max_offset=7).records) == [1, 2]
    assert offsets_in(log.read(3, 1 << 20, max_offset=7).records) == [3, 4, 5]


def test_a_batch_larger_than_segment_bytes_still_goes_in_alone(tmp_path):
    log = Log(tmp_path / "t-0", config(segment_bytes=100))
    log.append(batch(1, value=b"x" * 500), now_ms=0)
    log.append(batch(1, value=b"x" * 500), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_roll_on_segment_ms_uses_record_time(tmp_path):
    log = Log(tmp_path / "t-0", config(segment_ms=1_000))
    log.append(batch(1, ts=10_000), now_ms=0)
    log.append(batch(1, ts=10_900), now_ms=0)
    assert len(log.segments) == 1
    log.append(batch(1, ts=11_001), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_when_the_offset_index_is_full(tmp_path):
    # 5 offset entries; equal timestamps add a single time index entry, so that one never fills
    log = Log(tmp_path / "t-0", config(index_interval_bytes=0, segment_index_bytes=40))
    for _ in range(8):
        log.append(batch(1), now_ms=0)
    # entries are added for batches 1-5 (none for position 0); batch 6 finds the index full
    assert [s.base_offset for s in log.segments] == [0, 6]
    assert offsets_in(log.read(2, 1 << 20, max_offset=8).records) == [2, 3, 4, 5]


def test_roll_when_the_time_index_is_full(tmp_path):
    # 3 time index slots, full at 2 so the final entry still fits when the segment is sealed
    log = Log(tmp_path / "t-0", config(index_interval_bytes=0, segment_index_bytes=36))
    for i in range(6):
        log.append(batch(1, ts=1_000 + i), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6][: len(log.segments)]
    sealed = log.segments[0].time_index
    assert sealed.last_entry() == (1_002, 2) and sealed.path.stat().st_size == 24


def test_sparse_index_lookups(tmp_path):
    log = Log(tmp_path / "t-0", config(index_interval_bytes=1000))
    for _ in range(100):
        log.append(batch(2), now_ms=0)
    index = log.active_segment.offset_index
    assert 10 < index.entries < 50
    for target in (0, 1, 57, 120, 199):
        assert offsets_in(log.read(target, 1, max_offset=200).records)[0] == target - target % 2


def test_log_append_time(tmp_path):
    log = Log(tmp_path / "t-0", config(message_timestamp_type="LogAppendTime"))
    result = log.append(batch(3, ts=1), now_ms=42_000)
    assert result.log_append_time == 42_000
    data = log.read(0, 1 << 20, max_offset=3).records
    [h] = parse_batches(data)
    assert (h.timestamp_type, h.max_timestamp) == (1, 42_000)
    assert [r.timestamp for r in DefaultRecordBatch(data)] == [42_000] * 3


def test_topic_compression_type_recompresses(tmp_path):
    log = Log(tmp_path / "t-0", config(compression_type="gzip"))
    log.append(batch(4, codec=0), now_ms=0)
    data = log.read(0, 1 << 20, max_offset=4).records
    [h] = parse_batches(data)
    assert h.compression == 1
    assert [r.value for r in decode_batch(data)] == [b"v" * 100] * 4


def test_compacted_topic_requires_keys(tmp_path):
    log = Log(tmp_path / "t-0", config(cleanup_policy="compact"))
    log.append(batch(2), now_ms=0)
    with pytest.raises(KafkaError) as e:
        log.append(batch(2, key=None), now_ms=0)
    assert e.value.code == ErrorCode.invalid_record
    assert log.log_end_offset == 2


@pytest.mark.parametrize(
    "records,code",
    [
        (b"", ErrorCode.invalid_record),
        (batch(1) + batch(1), ErrorCode.invalid_record),  # one batch per partition per request
        (batch(1)[:-3], ErrorCode.corrupt_message),
        (build_control_batch(1, 0, 0, True, 0), ErrorCode.invalid_record),
        (batch(1, value=b"x" * 2_000_000), ErrorCode.message_too_large),
    ],
)
def test_rejected_appends_change_nothing(log, records, code):
    log.append(batch(1), now_ms=0)
    with pytest.raises(KafkaError) as e:
        log.append(records, now_ms=0)
    assert e.value.code == code
    assert log.log_end_offset == 1 and log.active_segment.size == len(batch(1))


def test_idempotent_retry_is_answered_with_the_original_offsets(log):
    log.append(batch(1), now_ms=0)
    first = log.append(batch(3, producer_id=7, epoch=0, seq=0), now_ms=0)
    second = log.append(batch(2, producer_id=7, epoch=0, seq=3), now_ms=0)
    retry = log.append(batch(3, producer_id=7, epoch=0, seq=0), now_ms=0)
    assert (first.base_offset, second.base_offset) == (1, 4)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (1, 3)
    assert log.log_end_offset == 6
    with pytest.raises(KafkaError) as e:
        log.append(batch(1, producer_id=7, epoch=0, seq=9), now_ms=0)
    assert e.value.code == ErrorCode.out_of_order_sequence_number


def test_open_transaction_holds_the_last_stable_offset(log):
    log.append(batch(2), now_ms=0)
    log.append(batch(2, producer_id=3, epoch=0, seq=0, txn=True), now_ms=0)
    log.append(batch(2), now_ms=0)
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert (log.high_watermark, log.last_stable_offset) == (6, 2)
    assert offsets_in(log.read(0, 1 << 20, max_offset=log.last_stable_offset).records) == [0, 1]
    marker = log.append(build_control_batch(3, 0, 0, True, 5), now_ms=0, origin="coordinator")
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert marker.base_offset == 6 and log.last_stable_offset == 7
    assert log.read(0, 1 << 20, max_offset=7).last_stable_offset == 7


def test_offset_for_timestamp(tmp_path):
    log = Log(tmp_path / "t-0", config(index_interval_bytes=200, segment_bytes=3_000))
    for i in range(40):
        log.append(batch(2, ts=1_000 + 10 * i), now_ms=0)  # offsets 2i, 2i+1 at 1000+10i, 1001+10i
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(0) == (0, 1_000)
    assert log.offset_for_timestamp(1_001) == (1, 1_001)
    assert log.offset_for_timestamp(1_002) == (2, 1_010)
    assert log.offset_for_timestamp(1_255) == (52, 1_260)
    assert log.offset_for_timestamp(1_391) == (79, 1_391)
    assert log.offset_for_timestamp(1_392) is None


def test_offset_for_timestamp_with_out_of_order_timestamps(log):
    for ts in (500, 100, 900, 300):
        log.append(batch(1, ts=ts), now_ms=0)
    assert log.offset_for_timestamp(200) == (0, 500)
    assert log.offset_for_timestamp(600) == (2, 900)


def test_max_timestamp_offset(tmp_path):
    log = Log(tmp_path / "t-0", config(segment_bytes=300))
    assert log.max_timestamp_offset() is None
    for ts in (100, 5_000, 300, 400, 200):
        log.append(build_batch([Record(b"k", b"v" * 50, (), ts), Record(b"k", b"v", (), ts - 1)]), now_ms=0)
    assert len(log.segments) > 1
    assert log.max_timestamp_offset() == (2, 5_000)


def test_truncate_to_drops_whole_batches_and_appends_continue(tmp_path):
    size = len(batch(2))
    log = Log(tmp_path / "t-0", config(segment_bytes=3 * size, index_interval_bytes=0))
    for _ in range(6):
        log.append(batch(2), now_ms=0)
    assert len(log.segments) == 2
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    log.truncate_to(5)  # inside batch 4-5
    assert log.log_end_offset == log.high_watermark == 4
    assert [s.base_offset for s in log.segments] == [0]
    assert log.append(batch(1), now_ms=0).base_offset == 4
    assert offsets_in(log.read(0, 1 << 20, max_offset=5).records) == [0, 1, 2, 3, 4]
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.append(batch(1), now_ms=0).base_offset == 0


def test_truncate_rewinds_producer_state(log):
    log.append(batch(2, producer_id=7, epoch=0, seq=0), now_ms=0)
    log.append(batch(2, producer_id=7, epoch=0, seq=2), now_ms=0)
    log.truncate_to(2)
    assert log.append(batch(2, producer_id=7, epoch=0, seq=2), now_ms=0).base_offset == 2


def test_flush_messages_moves_the_recovery_point(tmp_path):
    log = Log(tmp_path / "t-0", config(flush_messages=5))
    log.append(batch(3), now_ms=0)
    assert log.recovery_point == 0
    log.append(batch(3), now_ms=0)
    assert log.recovery_point == 6


def test_flush_ms(tmp_path):
    log = Log(tmp_path / "t-0", config(flush_ms=1_000), now_ms=0)
    log.append(batch(1), now_ms=500)
    assert log.recovery_point == 0
    log.append(batch(1), now_ms=1_000)
    assert log.recovery_point == 2


def test_roll_moves_the_recovery_point_and_snapshots_producers(tmp_path):
    size = len(batch(1))
    log = Log(tmp_path / "t-0", config(segment_bytes=2 * size))
    for _ in range(3):
        log.append(batch(1), now_ms=0)
    assert log.recovery_point == 2
    assert (tmp_path / "t-0" / "00000000000000000002.snapshot").exists()


def test_close_and_clean_reopen(tmp_path):
    cfg = config(segment_bytes=2_000, index_interval_bytes=300)
    log = Log(tmp_path / "t-0", cfg)
    for i in range(30):
        log.append(batch(2, ts=i, producer_id=1, epoch=0, seq=2 * i), now_ms=0)
    log.close()
    for path in (tmp_path / "t-0").glob("*.index"):
        assert path.stat().st_size % 8 == 0 and path.stat().st_size < 10_000
    reopened = Log(tmp_path / "t-0", cfg, recovery_point=60, clean_shutdown=True)
    assert reopened.log_end_offset == 60 and reopened.high_watermark == 60
    assert offsets_in(reopened.read(33, 1 << 20, max_offset=60).records)[:2] == [32, 33]
    assert reopened.append(batch(2, producer_id=1, epoch=0, seq=60), now_ms=0).base_offset == 60
    assert reopened.append(batch(2, producer_id=1, epoch=0, seq=60), now_ms=0).duplicate
    assert reopened.offset_for_timestamp(29) == (57, 29)  # batch 56-57 holds timestamps 28, 29


def test_delete_removes_the_directory(log):
    log.append(batch(1), now_ms=0)
    log.delete()
    assert not log.directory.exists()


def test_read_committed_lists_aborted_transactions_across_segments(tmp_path):
    size = len(batch(2))
    log = Log(tmp_path / "t-0", config(segment_bytes=4 * size))
    log.append(batch(2, producer_id=1, epoch=0, seq=0, txn=True), now_ms=0)  # 0-1, aborted later
    log.append(batch(2, producer_id=2, epoch=0, seq=0, txn=True), now_ms=0)  # 2-3, committed
    log.append(batch(2), now_ms=0)  # 4-5
    log.append(build_control_batch(2, 0, 0, True, 0), now_ms=0, origin="coordinator")  # 6 commit
    log.append(batch(2), now_ms=0)  # 7-8, a new segment
    log.append(build_control_batch(1, 0, 0, False, 0), now_ms=0, origin="coordinator")  # 9 abort
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert [s.base_offset for s in log.segments] == [0, 7]
    assert log.last_stable_offset == 10
    data = log.read(0, 1 << 20, max_offset=10, with_aborted=True)
    assert offsets_in(data.records)[:2] == [0, 1]
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in data.aborted_transactions] == [(1, 0, 9)]
    assert log.read(0, 1 << 20, max_offset=10).aborted_transactions is None
    assert log.read(10, 1 << 20, max_offset=10, with_aborted=True).aborted_transactions == []
    # the entry lives with the ABORT marker's segment
    assert (tmp_path / "t-0" / "00000000000000000007.txnindex").stat().st_size == 34
    log.truncate_to(9)
    assert log.read(0, 1 << 20, max_offset=9, with_aborted=True).aborted_transactions == []
    assert log.last_stable_offset == 0  # producer 1's transaction is open again


def test_flush_if_due(tmp_path):
    log = Log(tmp_path / "t-0", config(flush_ms=1_000), now_ms=0)
    log.append(batch(1), now_ms=100)
    log.flush_if_due(900)
    assert log.recovery_point == 0
    log.flush_if_due(1_000)
    assert log.recovery_point == 1


def test_a_failed_write_leaves_no_torn_batch(log, monkeypatch):
    log.append(batch(1), now_ms=0)
    real_write = os.write

    def disk_full(fd, buffers):
        real_write(fd, b"".join(buffers)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "writev", disk_full)
    with pytest.raises(KafkaError) as e:
        log.append(batch(1), now_ms=0)
    assert e.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert log.log_end_offset == 1 and log.active_segment.size == len(batch(1))
    assert log.append(batch(1), now_ms=0).base_offset == 1
    assert offsets_in(log.read(0, 1 << 20, max_offset=2).records) == [0, 1]


NOW = 1_700_000_000_000
HOUR = 3_600_000


def test_create_times_more_than_an_hour_ahead_are_refused_by_default(log):
    """Kafka 4's default message.timestamp.after.max.ms is one hour; the past is unbounded."""
    log.append(batch(1, ts=NOW + HOUR), now_ms=NOW)
    log.append(batch(1, ts=1), now_ms=NOW)
    with pytest.raises(KafkaError) as e:
        log.append(batch(3, ts=NOW + HOUR - 1), now_ms=NOW)  # its last record is one ms too late
    assert e.value.code == ErrorCode.invalid_timestamp
    assert log.log_end_offset == 2


@pytest.mark.parametrize("codec", [0, 1])
def test_a_finite_before_max_checks_every_record(tmp_path, codec):
    log = Log(tmp_path / "t-0", config(message_timestamp_before_max_ms=60_000))
    log.append(batch(2, ts=NOW - 60_000, codec=codec), now_ms=NOW)
    late_first = build_batch([Record(b"k", b"v", (), NOW), Record(b"k", b"v", (), NOW - 60_001)], compression=codec)
    with pytest.raises(KafkaError) as e:
        log.append(late_first, now_ms=NOW)
    assert e.value.code == ErrorCode.invalid_timestamp
    assert log.log_end_offset == 2


def test_log_append_time_topics_take_any_create_time(tmp_path):
    log = Log(tmp_path / "t-0", config(message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=0,
                                       message_timestamp_after_max_ms=0))
    assert log.append(batch(1, ts=NOW + 10 * HOUR), now_ms=NOW).log_append_time == NOW


def test_a_short_write_is_completed(log, monkeypatch):
    """The produce path writes a patched head and the request's own buffer with one writev;
    when the kernel takes only part of it, the rest still lands, in order."""
    real_write = os.write

    def short_writev(fd, buffers):
        return real_write(fd, b"".join(buffers)[:10])

    monkeypatch.setattr(os, "writev", short_writev)
    sent = [batch(1), batch(3)]
    for data in sent:
        log.append(data, now_ms=0, leader_epoch=4)
    monkeypatch.undo()
    assert log.active_segment.size == sum(len(data) for data in sent)
    assert offsets_in(log.read(0, 1 << 20, max_offset=4).records) == [0, 1, 2, 3]


def test_retention_by_time_deletes_old_segments_only(tmp_path):
    size = len(batch(1))
    log = Log(tmp_path / "t-0", config(segment_bytes=2 * size, retention_ms=1_000))
    for ts in (100, 200, 300, 400, 5_000, 5_100, 5_200):
        log.append(batch(1, ts=ts), now_ms=0)
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    assert log.apply_retention(now_ms=5_500) == 2  # segments ending at 200 and 400
    assert log.log_start_offset == 4 and [s.base_offset for s in log.segments] == [4, 6]
    assert not (tmp_path / "t-0" / "00000000000000000000.log").exists()
    with pytest.raises(KafkaError):
        log.read(3, 100, max_offset=7)
    assert offsets_in(log.read(4, 1 << 20, max_offset=7).records) == [4, 5]
    assert log.apply_retention(now_ms=1_000_000) == 1  # never the active segment
    assert [s.base_offset for s in log.segments] == [6]


def test_retention_by_size(tmp_path):
    size = len(batch(1))
    log = Log(tmp_path / "t-0", config(segment_bytes=2 * size, retention_bytes=3 * size))
    for _ in range(7):
        log.append(batch(1), now_ms=0)
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert log.apply_retention(now_ms=0) == 2  # 7 batches -> keep the newest 3 or more
    assert log.log_start_offset == 4 and sum(s.size for s in log.segments) == 3 * size


def test_compacted_topics_are_not_deleted_by_retention(tmp_path):
    log = Log(tmp_path / "t-0", config(segment_bytes=200, retention_ms=0, cleanup_policy="compact"))
    for _ in range(4):
        log.append(batch(1), now_ms=0)
    assert log.apply_retention(now_ms=10**12) == 0


def test_delete_records_before(tmp_path):
    size = len(batch(2))
    log = Log(tmp_path / "t-0", config(segment_bytes=2 * size))
    for _ in range(4):
        log.append(batch(2), now_ms=0)
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert log.delete_records_before(5) == 5
    assert [s.base_offset for s in log.segments] == [4]
    assert offsets_in(log.read(5, 1 << 20, max_offset=8).records) == [4, 5, 6, 7]
    assert log.delete_records_before(3) == 5  # never backwards
    with pytest.raises(KafkaError) as e:
        log.delete_records_before(9)
    assert e.value.code == ErrorCode.offset_out_of_range


def test_lookups_that_scan_across_read_chunks(tmp_path):
    log = Log(tmp_path / "t-0", config(index_interval_bytes=100_000_000))  # no index entries at all
    for i in range(300):
        log.append(batch(1, value=bytes([i % 256]) * (700 + i)), now_ms=0)
    assert log.active_segment.offset_index.entries == 0 and log.active_segment.size > 4 * 64 * 1024
    for target in (0, 91, 92, 93, 150, 299):
        [(_, records)] = list(iter_batches(log.read(target, 1, max_offset=300).records))
        assert records[0].offset == target and records[0].value == bytes([target % 256]) * (700 + target)


def test_recovery_of_a_batch_larger_than_the_scan_chunk(tmp_path):
    cfg = config(max_message_bytes=8_000_000)
    log = Log(tmp_path / "t-0", cfg)
    log.append(batch(1), now_ms=0)
    log.append(batch(1, value=os.urandom(5_000_000)), now_ms=0)
    log.append(batch(1), now_ms=0)
    recovered = Log(tmp_path / "t-0", cfg, recovery_point=0)  # as after a crash: full scan
    assert recovered.log_end_offset == 3
    assert offsets_in(recovered.read(1, 100, max_offset=3).records) == [1]


def test_truncation_into_a_sealed_segment_survives_a_clean_restart(tmp_path):
    cfg = config(segment_bytes=3_000, index_interval_bytes=200)
    log = Log(tmp_path / "t-0", cfg)
    for i in range(40):
        log.append(batch(1, ts=i), now_ms=0)
    assert len(log.segments) > 2
    cut = log.segments[1].base_offset + 5
    log.truncate_to(cut)
    entries = log.active_segment.offset_index.entries
    log.close()
    index = tmp_path / "t-0" / f"{log.segments[-1].base_offset:020d}.index"
    assert index.stat().st_size == entries * 8
    reopened = Log(tmp_path / "t-0", cfg, recovery_point=cut, clean_shutdown=True)
    assert reopened.append(batch(1, ts=100), now_ms=0).base_offset == cut
    for target in range(cut + 1):
        assert offsets_in(reopened.read(target, 1, max_offset=cut + 1).records) == [target]
    assert reopened.offset_for_timestamp(cut - 1) == (cut - 1, cut - 1)
    assert reopened.offset_for_timestamp(cut) == (cut, 100)


def test_truncating_a_batch_that_straddles_the_log_start_leaves_an_empty_log_at_the_start(log):
    log.append(batch(3), now_ms=0)  # offsets 0-2
    log.high_watermark = 3
    log.delete_records_before(1)  # the log start falls inside the batch
    log.truncate_to(2)  # whole batches: 0-2 goes, and with it everything readable
    assert (log.log_start_offset, log.log_end_offset) == (1, 1)
    assert log.append(batch(1), now_ms=0).base_offset == 1
