"""The recovery-point checkpoint never claims more than the disk holds: an unclean load scans
only from the segment holding the checkpointed recovery point and trusts every segment below
it, so a checkpointed value above the durable prefix would leave a torn or missing segment
unscanned. Crashes are a reopen without a clean shutdown; power losses cut every file back
to its last fsync (tests/powerloss.py)."""

from __future__ import annotations

import threading

import pytest

from ottla.config import BrokerConfig
from ottla.log import LogManager
from ottla.log.disk_worker import DiskWorker
from ottla.log.manager import RECOVERY_POINT_FILE, read_offset_checkpoint
from ottla.records.records import Record, build_batch, iter_batches
from powerloss import PowerLoss

TOPIC = {"segment.bytes": "4000"}


def append(log, value: bytes, records: int = 1) -> None:
    log.append(build_batch([Record(b"k", value, (), 1_000)] * records), now_ms=0)
    log.update_high_watermark(log.log_end_offset)


def contents(log) -> list[tuple[int, bytes]]:
    """(offset, value) of every record from the log start to the log end, through the fetch
    path; every offset must be there, in intact batches."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=log.log_end_offset).records
        assert data, f"nothing readable at offset {offset} below the log end {log.log_end_offset}"
        out += [(r.offset, r.value) for _, records in iter_batches(data) for r in records if r.offset >= offset]
        offset = out[-1][0] + 1
    assert [o for o, _ in out] == list(range(log.log_start_offset, log.log_end_offset))
    return out


def test_rolls_after_a_truncation_below_the_checkpointed_recovery_point_survive_a_power_loss(tmp_path):
    """A follower truncates into its first segment, then appends its leader's history and
    rolls at an offset below the recovery point the checkpoint still holds (Kafka writes the
    checkpoint at once after a truncation; Ottla does not). The next unclean load starts
    scanning above the rolled segment, so its fsync must not wait for the disk worker."""
    worker = DiskWorker()
    held = threading.Event()
    try:
        manager = LogManager(tmp_path, BrokerConfig(), disk_worker=worker)
        manager.create_topic("t", 1, TOPIC)
        log = manager.get_log("t", 0)
        for i in range(120):
            append(log, b"old-%03d" % i * 8)
        worker.drain()  # the rolls' fsyncs ran: the recovery point is the active segment's base
        manager.checkpoint(inline=True)
        checkpointed = read_offset_checkpoint(tmp_path / RECOVERY_POINT_FILE)[("t", 0)]
        assert checkpointed == log.segments[-1].base_offset > log.segments[1].base_offset
        with PowerLoss(tmp_path) as power:
            worker.submit("holding the worker", lambda: held.wait(60))
            log.truncate_to(3)  # into the first segment; what was above it goes
            expected = contents(log)
            while len(log.segments) < 2:  # the leader's history, in batches of other sizes
                base, value = log.log_end_offset, b"new-%03d" % log.log_end_offset * 5
                append(log, value, records=3)
                expected += [(base + j, value) for j in range(3)]
            rolled_at = log.segments[-1].base_offset
            assert rolled_at <= checkpointed  # the scan will start above the rolled segment
            expected.append((log.log_end_offset, b"after the roll"))
            append(log, b"after the roll")
            power.crash()
        reopened = LogManager(tmp_path, BrokerConfig()).get_log("t", 0)
        assert reopened.log_end_offset >= rolled_at
        assert contents(reopened) == expected[:reopened.log_end_offset]
    finally:
        held.set()
        worker.close()


@pytest.mark.parametrize("disk_worker", [False, True], ids=["inline", "disk-worker"])
def test_a_topic_created_again_does_not_take_the_old_ones_checkpointed_offsets(tmp_path, disk_worker):
    """The old topic's log start offset (and recovery point, high watermark) stayed in the
    checkpoints until the next periodic write: a crash then hid the new topic's first records
    behind the old log start. Kafka rewrites the checkpoints when it deletes a log."""
    worker = DiskWorker() if disk_worker else None
    manager = LogManager(tmp_path, BrokerConfig(), disk_worker=worker)
    manager.create_topic("t", 1, TOPIC)
    log = manager.get_log("t", 0)
    for i in range(100):
        append(log, b"old-%03d" % i * 8)
    assert log.delete_records_before(60) == 60
    if worker is not None:
        worker.drain()
    manager.checkpoint(inline=True)
    manager.delete_topic("t")
    manager.create_topic("t", 1, TOPIC)
    log = manager.get_log("t", 0)
    for i in range(100):
        append(log, b"new-%03d" % i)
    if worker is not None:
        worker.close()
    reopened = LogManager(tmp_path, BrokerConfig()).get_log("t", 0)  # a crash: no clean shutdown
    assert reopened.log_start_offset == 0
    assert contents(reopened) == [(i, b"new-%03d" % i) for i in range(100)]


def test_an_unclean_load_checkpoints_no_recovery_point_above_what_it_fsynced(tmp_path):
    """After a crash the recovered active segment is in the page cache, not necessarily on
    disk: a recovery point at the log end, checkpointed, would claim it durable."""
    manager = LogManager(tmp_path, BrokerConfig())
    manager.create_topic("t", 1, TOPIC)
    log = manager.get_log("t", 0)
    for i in range(100):
        append(log, b"v-%03d" % i * 8)
    manager.checkpoint(inline=True)
    with PowerLoss(tmp_path) as power:
        for i in range(100, 110):
            append(log, b"v-%03d" % i * 8)  # into the active segment, never fsynced
        manager = LogManager(tmp_path, BrokerConfig())  # kill -9: the page cache still has them
        assert manager.get_log("t", 0).log_end_offset == 110
        manager.checkpoint(inline=True)
        checkpointed = read_offset_checkpoint(tmp_path / RECOVERY_POINT_FILE)[("t", 0)]
        power.crash()
    reopened = LogManager(tmp_path, BrokerConfig()).get_log("t", 0)
    assert checkpointed <= reopened.log_end_offset  # everything below it was on disk
    contents(reopened)
