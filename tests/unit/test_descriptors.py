"""F8 (issue 11): descriptors follow need, not partition or segment counts; a topic that cannot
be created fully is not created at all; the broker raises its soft open-files limit."""

from __future__ import annotations

import os
import resource

import pytest

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log.manager import LogManager
from ottla.log.segment import MAX_OPEN_SEALED
from ottla.records.records import Record, build_batch
from ottla.server.main import raise_open_files_limit


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fd_limit_1024():
    """The issue's setting: a 1,024 soft limit (restored afterwards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_5000_partitions_under_a_1024_descriptor_limit(tmp_path, fd_limit_1024):
    manager = LogManager(tmp_path, BrokerConfig())
    before = open_fds()
    manager.create_topic("wide", 5000)
    assert open_fds() - before < 10  # no descriptor per idle partition
    for partition in (0, 2500, 4999):
        manager.get_log("wide", partition).append(build_batch([Record(b"k", b"v", (), 1_000)]), now_ms=1_000)
    assert open_fds() - before < 20
    manager.create_topic("more", 10)  # the broker still takes topics
    manager.close()
    reopened = LogManager(tmp_path, BrokerConfig())
    assert open_fds() - before < 20
    assert reopened.get_log("wide", 4999).log_end_offset == 1
    reopened.close()


def test_a_create_that_fails_part_way_leaves_nothing(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig())
    manager.create_topic("other", 1)
    (tmp_path / "t-3").write_text("a stray file where partition 3's directory must go")
    before = open_fds()
    with pytest.raises(KafkaError) as excinfo:
        manager.create_topic("t", 6)
    assert excinfo.value.code is ErrorCode.kafka_storage_error
    assert "t" not in manager.topics and not any(key[0] == "t" for key in manager.logs)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t-")) == ["t-3"]
    assert open_fds() == before
    (tmp_path / "t-3").unlink()
    assert manager.create_topic("t", 6).partitions == 6  # and the name is free to use
    manager.close()


def test_sealed_segments_keep_descriptors_only_while_recently_read(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig())
    manager.create_topic("t", 1, {"segment.bytes": 200})
    log = manager.get_log("t", 0)
    for i in range(4 * MAX_OPEN_SEALED):
        log.append(build_batch([Record(b"k", b"v" * 100, (), 1_000 + i)]), now_ms=1_000)
    assert len(log.segments) > 3 * MAX_OPEN_SEALED + 50  # more than the bound below, one descriptor each
    before = open_fds()
    for offset in range(log.log_end_offset):  # a consumer reading the whole log from the start
        assert log.read(offset, 1 << 20, max_offset=log.log_end_offset).records
    assert open_fds() - before <= 3 * MAX_OPEN_SEALED  # a .log and a mapped index (mmap holds a dup)
    manager.close()


def test_the_soft_open_files_limit_is_raised_to_the_hard_limit(fd_limit_1024):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard in (soft, resource.RLIM_INFINITY):
        pytest.skip("the hard limit leaves nothing to raise")
    assert raise_open_files_limit() == (hard, hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
