"""Issue 11: one partition whose periodic duty fails does not stop flushes, checkpoints and
retention for the others."""

from __future__ import annotations

import logging

from ottla import durability
from ottla.config import BrokerConfig
from ottla.log.manager import RECOVERY_POINT_FILE, LogManager, read_offset_checkpoint
from ottla.records.records import Record, build_batch


def test_a_failing_partition_does_not_stop_the_others(tmp_path, monkeypatch, caplog):
    # EIO on every sync of partition a-0 once its records are appended (the first append's
    # leader epoch checkpoint is synced too, and would fail the append itself), through the
    # failpoint of ottla.durability, with the broker's halt replaced so the manager's handling
    # can be seen in process.
    monkeypatch.setattr(durability, "_on_failure", lambda path, exc: None)
    config = BrokerConfig({"log.flush.offset.checkpoint.interval.ms": 0, "log.retention.check.interval.ms": 1})
    manager = LogManager(tmp_path, config, clock=lambda: 0)
    manager.create_topic("a", 1, {"flush.ms": 1})
    manager.create_topic("b", 1, {"flush.ms": 1, "segment.bytes": 200, "retention.ms": 1000})
    for name in ("a", "b"):
        for i in range(5):
            manager.get_log(name, 0).append(build_batch([Record(b"k", b"v" * 100, (), 1_000 + i)]), now_ms=0)
    monkeypatch.setattr(durability, "_FAILING", ("a-0",))
    b = manager.get_log("b", 0)
    b.high_watermark = b.log_end_offset  # what the replica manager does on one node
    assert len(b.segments) > 1
    with caplog.at_level(logging.ERROR, logger="ottla.log.manager"):
        for now in (10_000, 11_000):
            manager.tick(now)
    assert b.recovery_point == b.log_end_offset == 5          # b was flushed
    assert b.log_start_offset > 0                             # and its retention ran
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_FILE)[("b", 0)] == 5  # the checkpoint was written
    assert manager.get_log("a", 0).recovery_point == 0        # a's flush failed
    assert len([r for r in caplog.records if "a-0" in r.getMessage()]) == 1  # said once, not every second
