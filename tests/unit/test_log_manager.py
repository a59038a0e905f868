"""LogManager: the topic catalog, checkpoints, clean-shutdown fast path and crash restart."""

import json
import uuid

import pytest

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log import LogManager
from ottla.log.index import OffsetIndex, TimeIndex
from ottla.log.manager import read_offset_checkpoint
from ottla.log.segment import LogSegment
from ottla.producer_state.manager import ProducerStateManager
from ottla.records.records import Record, build_batch, iter_batches


def batch(n=1, value=b"v" * 50):
    return build_batch([Record(b"k", value, (), 1_000 + i) for i in range(n)])


@pytest.fixture
def manager(tmp_path):
    return LogManager(tmp_path, BrokerConfig())


def code(excinfo):
    return excinfo.value.code


def test_create_topic(manager, tmp_path):
    info = manager.create_topic("orders", 3, {"retention.ms": "1000"})
    assert (info.name, info.partitions, info.config["retention.ms"]) == ("orders", 3, 1000)
    assert isinstance(info.topic_id, uuid.UUID)
    assert all((tmp_path / f"orders-{p}").is_dir() for p in range(3))
    meta = json.loads((tmp_path / ".topics" / f"{info.topic_id}.json").read_text())
    assert meta == {
        "name": "orders",
        "topic_id": str(info.topic_id),
        "partitions": 3,
        "configs": {"retention.ms": 1000},
    }
    assert manager.get_log("orders", 2).log_end_offset == 0
    assert manager.topic_by_id(info.topic_id) is info


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "with space", "ümlaut", "a/b", "a:b"])
def test_invalid_topic_names(manager, name):
    with pytest.raises(KafkaError) as e:
        manager.create_topic(name, 1)
    assert code(e) == ErrorCode.invalid_topic_exception


def test_legal_edge_names(manager):
    for name in ("a" * 249, "__consumer_offsets", "A-b.c_9", "..."):
        manager.create_topic(name, 1)


def test_create_errors(manager):
    manager.create_topic("t", 1)
    with pytest.raises(KafkaError) as e:
        manager.create_topic("t", 1)
    assert code(e) == ErrorCode.topic_already_exists
    manager.create_topic("a.b", 1)
    with pytest.raises(KafkaError) as e:
        manager.create_topic("a_b", 1)
    assert code(e) == ErrorCode.invalid_topic_exception
    with pytest.raises(KafkaError) as e:
        manager.create_topic("zero", 0)
    assert code(e) == ErrorCode.invalid_partitions
    for bad in ({"no.such.config": "1"}, {"segment.bytes": "abc"}, {"segment.bytes": "1"}):
        with pytest.raises(KafkaError) as e:
            manager.create_topic("bad", 1, bad)
        assert code(e) == ErrorCode.invalid_config
    assert "zero" not in manager.topics and "bad" not in manager.topics


def test_validate_only_creates_nothing(manager, tmp_path):
    manager.create_topic("dry", 2, validate_only=True)
    assert "dry" not in manager.topics and not (tmp_path / "dry-0").exists()


def test_delete_topic(manager, tmp_path):
    info = manager.create_topic("gone", 2)
    manager.get_log("gone", 0).append(batch(), now_ms=0)
    manager.delete_topic("gone")
    assert not (tmp_path / "gone-0").exists() and not (tmp_path / ".topics" / f"{info.topic_id}.json").exists()
    with pytest.raises(KafkaError) as e:
        manager.get_log("gone", 0)
    assert code(e) == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaError) as e:
        manager.delete_topic("gone")
    assert code(e) == ErrorCode.unknown_topic_or_partition
    manager.create_topic("gone", 1)  # the name is free again, with an empty log
    assert manager.get_log("gone", 0).log_end_offset == 0


def test_add_partitions(manager, tmp_path):
    manager.create_topic("grow", 2)
    assert manager.add_partitions("grow", 5).partitions == 5
    assert manager.get_log("grow", 4).log_end_offset == 0
    for total in (5, 3):
        with pytest.raises(KafkaError) as e:
            manager.add_partitions("grow", total)
        assert code(e) == ErrorCode.invalid_partitions
    reopened = LogManager(tmp_path, BrokerConfig())
    assert reopened.topics["grow"].partitions == 5


def test_a_cluster_broker_holds_only_its_partitions_and_drops_one_moved_away(manager, tmp_path):
    info = manager.create_topic("moved", 3, absent=frozenset({0}))
    assert not (tmp_path / "moved-0").exists() and info.hosted == [1, 2]
    manager.get_log("moved", 1).append(batch(), now_ms=0)
    manager.delete_partitions("moved", {1})
    assert not (tmp_path / "moved-1").exists() and (tmp_path / "moved-2").is_dir()
    with pytest.raises(KafkaError) as e:
        manager.get_log("moved", 1)
    assert code(e) == ErrorCode.unknown_topic_or_partition
    manager.close()
    (tmp_path / "moved-1").mkdir()  # a deletion cut short after its commit point
    reopened = LogManager(tmp_path, BrokerConfig())
    assert reopened.topics["moved"].hosted == [2] and not (tmp_path / "moved-1").exists()
    reopened.host_partitions("moved", {1})  # moved back here: empty again
    assert reopened.get_log("moved", 1).log_end_offset == 0
    reopened.add_partitions("moved", 5, absent=frozenset({3}))
    assert reopened.topics["moved"].hosted == [1, 2, 4]
    reopened.delete_partitions("moved", {1})
    reopened.delete_partitions("moved", {2, 4})
    assert "moved" not in reopened.topics  # the last one held takes the topic file with it
    assert not (tmp_path / ".topics" / f"{info.topic_id}.json").exists()


def test_alter_configs_applies_to_live_logs_and_persists(manager, tmp_path):
    manager.create_topic("cfg", 1)
    manager.alter_configs("cfg", {"message.timestamp.type": "LogAppendTime"})
    assert manager.get_log("cfg", 0).append(batch(), now_ms=777).log_append_time == 777
    with pytest.raises(KafkaError) as e:
        manager.alter_configs("cfg", {"message.timestamp.type": "Sometime"})
    assert code(e) == ErrorCode.invalid_config
    manager.close()
    assert LogManager(tmp_path, BrokerConfig()).topics["cfg"].config.overrides == {
        "message.timestamp.type": "LogAppendTime"
    }


def test_clean_restart_keeps_everything_and_writes_kafka_checkpoints(manager, tmp_path):
    info = manager.create_topic("t", 2)
    for _ in range(3):
        manager.get_log("t", 1).append(batch(2), now_ms=0)
    manager.close()
    assert (tmp_path / ".kafka_cleanshutdown").exists()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n2\nt 0 0\nt 1 6\n"
    reopened = LogManager(tmp_path, BrokerConfig())
    assert not (tmp_path / ".kafka_cleanshutdown").exists()  # a crash from now on must be noticed
    assert reopened.topics["t"].topic_id == info.topic_id
    log = reopened.get_log("t", 1)
    assert log.log_end_offset == 6
    assert log.append(batch(), now_ms=0).base_offset == 6


def test_crash_restart_recovers_from_the_checkpoint(manager, tmp_path):
    manager.create_topic("t", 1)
    log = manager.get_log("t", 0)
    for _ in range(4):
        log.append(batch(2), now_ms=0)
    log.flush()
    manager.checkpoint()
    log.append(batch(2), now_ms=0)
    # no close: the marker is absent, the checkpoint says 8, the log holds 10
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 8}
    reopened = LogManager(tmp_path, BrokerConfig())
    assert reopened.get_log("t", 0).log_end_offset == 10


def test_malformed_checkpoint_means_full_recovery(manager, tmp_path):
    manager.create_topic("t", 1)
    manager.get_log("t", 0).append(batch(3), now_ms=0)
    manager.close()
    (tmp_path / "recovery-point-offset-checkpoint").write_text("garbage\n")
    assert LogManager(tmp_path, BrokerConfig()).get_log("t", 0).log_end_offset == 3


def test_leftover_partition_directories_are_removed(manager, tmp_path):
    manager.create_topic("t", 1)
    (tmp_path / "half-created-0").mkdir()
    (tmp_path / "t-1").mkdir()  # beyond the topic's partition count
    (tmp_path / "not-a-partition").mkdir()
    LogManager(tmp_path, BrokerConfig())
    assert not (tmp_path / "half-created-0").exists() and not (tmp_path / "t-1").exists()
    assert (tmp_path / "not-a-partition").exists() and (tmp_path / "t-0").exists()


def test_a_thousand_partitions_reopen_without_touching_segments(tmp_path, monkeypatch):
    manager = LogManager(tmp_path, BrokerConfig({"log.index.size.max.bytes": 4096}))
    manager.create_topic("many", 1000)
    for p in range(0, 1000, 7):
        manager.get_log("many", p).append(batch(p % 5 + 1), now_ms=0)
    manager.close()

    def forbidden(*args, **kwargs):
        raise AssertionError("a clean start must not open segments, indexes or producer snapshots")

    monkeypatch.setattr(LogSegment, "_open", forbidden)
    monkeypatch.setattr(LogSegment, "recover", forbidden)
    monkeypatch.setattr(OffsetIndex, "open", forbidden)
    monkeypatch.setattr(TimeIndex, "open", forbidden)
    monkeypatch.setattr(ProducerStateManager, "__init__", forbidden)
    reopened = LogManager(tmp_path, BrokerConfig({"log.index.size.max.bytes": 4096}))
    assert [reopened.get_log("many", p).log_end_offset for p in range(0, 14)] == [
        (p % 5 + 1) if p % 7 == 0 else 0 for p in range(14)
    ]
    monkeypatch.undo()
    log = reopened.get_log("many", 7)
    assert [r.offset for _, rs in iter_batches(log.read(0, 1 << 20, max_offset=3).records) for r in rs] == [0, 1, 2]
    assert log.append(batch(), now_ms=0).base_offset == 3
    reopened.close()
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint")[("many", 7)] == 4


def test_tick_checkpoints_on_its_interval(tmp_path):
    broker = BrokerConfig({"log.flush.offset.checkpoint.interval.ms": 1_000})
    manager = LogManager(tmp_path, broker, clock=lambda: 0)
    manager.create_topic("t", 1, {"flush.ms": 10})
    manager.get_log("t", 0).append(batch(2), now_ms=0)
    manager.tick(500)
    assert not (tmp_path / "recovery-point-offset-checkpoint").exists()
    manager.tick(1_000)
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 2}


def test_high_watermarks_are_checkpointed_on_their_own_interval_and_restored(tmp_path):
    """replication-offset-checkpoint: what a follower may serve after a restart is its last
    known HW, not its log end (which may hold records never acknowledged)."""
    broker = BrokerConfig({"replica.high.watermark.checkpoint.interval.ms": 200})
    manager = LogManager(tmp_path, broker, clock=lambda: 0)
    manager.create_topic("t", 2)
    log0 = manager.get_log("t", 0)
    log0.append(batch(5), now_ms=0)
    log0.high_watermark = 3  # held back by a follower
    manager.tick(100)
    assert not (tmp_path / "replication-offset-checkpoint").exists()
    manager.tick(200)
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "0\n2\nt 0 3\nt 1 0\n"
    assert not (tmp_path / "recovery-point-offset-checkpoint").exists()  # its own, longer interval
    log0.append(batch(2), now_ms=0)  # the HW does not follow: crash now
    restarted = LogManager(tmp_path, broker, clock=lambda: 0)
    again = restarted.get_log("t", 0)
    assert (again.log_end_offset, again.high_watermark) == (7, 3)


def test_a_restored_high_watermark_stays_within_the_log(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig(), clock=lambda: 0)
    manager.create_topic("t", 1)
    manager.get_log("t", 0).append(batch(4), now_ms=0)
    manager.close()
    (tmp_path / "replication-offset-checkpoint").write_text("0\n1\nt 0 99\n")
    assert LogManager(tmp_path, BrokerConfig()).get_log("t", 0).high_watermark == 4
