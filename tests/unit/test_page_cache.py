"""The page-cache budget for fresh appends (log/page_cache.py), on a real log on disk."""

import os

import pytest

from ottla.config import BrokerConfig, TopicConfig
from ottla.log import Log
from ottla.log.manager import LogManager
from ottla.log.page_cache import CHUNK_BYTES, RecentAppends
from ottla.records.records import Record, build_batch, iter_batches
from tests.pagecache import resident_bytes

BATCH = build_batch([Record(None, os.urandom(1000), (), 1_000) for _ in range(256)])  # ~260 KB


def _fill(log: Log, megabytes: int) -> int:
    count = megabytes * (1 << 20) // len(BATCH) + 1
    for _ in range(count):
        log.append(BATCH, now_ms=2_000)
    return count


def _segment_path(log: Log):
    return log.active_segment.log_path


def test_appends_past_the_budget_leave_the_page_cache(tmp_path):
    budget = 4 * CHUNK_BYTES
    recent = RecentAppends(budget)
    log = Log(tmp_path / "t-0", TopicConfig(BrokerConfig({}), {}), recent_appends=recent)
    _fill(log, 18)
    recent.drain()
    size = os.path.getsize(_segment_path(log))
    resident = resident_bytes(_segment_path(log))
    assert size > 17 * CHUNK_BYTES
    assert resident <= budget + 2 * CHUNK_BYTES, (resident, size)


def test_a_chunk_not_yet_written_back_when_it_leaves_the_budget_still_leaves_the_cache(tmp_path):
    """A budget under one chunk evicts each chunk the moment its writeback starts: the case of a
    disk too busy to write a chunk back before the budget's worth of newer appends arrives. The
    kernel drops no page still under writeback; dropped without waiting, the chunk stayed cached
    for good (the old code left all of it here)."""
    recent = RecentAppends(1)
    log = Log(tmp_path / "t-0", TopicConfig(BrokerConfig({}), {}), recent_appends=recent)
    count = 0
    while log.active_segment.writeback_started_to == 0:  # appends until exactly one chunk has filled
        log.append(BATCH, now_ms=2_000)
        count += 1
    recent.drain()
    chunk = log.active_segment.writeback_started_to
    assert chunk >= CHUNK_BYTES and chunk == os.path.getsize(_segment_path(log)) == count * len(BATCH)
    assert resident_bytes(_segment_path(log)) == 0
    log.close()


def test_dropped_data_reads_back_unchanged(tmp_path):
    log = Log(tmp_path / "t-0", TopicConfig(BrokerConfig({}), {}), recent_appends=RecentAppends(2 * CHUNK_BYTES))
    count = _fill(log, 12)
    offset, batches = 0, 0
    while offset < log.log_end_offset:
        for header, records in iter_batches(log.read(offset, 1 << 20, max_offset=log.log_end_offset).records):
            assert [r.value for r in records] == [r.value for _, rs in iter_batches(BATCH) for r in rs]
            offset = header.last_offset + 1
            batches += 1
    assert batches == count


def test_zero_budget_leaves_the_page_cache_to_the_kernel(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig({"log.page.cache.max.bytes": 0}))
    assert manager.recent_appends is None
    manager.create_topic("t", 1, {})
    log = manager.get_log("t", 0)
    _fill(log, 8)
    assert resident_bytes(_segment_path(log)) >= os.path.getsize(_segment_path(log))  # whole pages
    manager.close()


def test_the_broker_default_is_a_budget(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig({}))
    assert manager.recent_appends is not None and manager.recent_appends.max_bytes == 256 << 20
    manager.close()


@pytest.mark.parametrize("value", ["-1", "lots"])
def test_a_bad_budget_is_refused(value):
    from ottla.errors import ConfigError

    with pytest.raises(ConfigError, match="log.page.cache.max.bytes"):
        BrokerConfig({"log.page.cache.max.bytes": value})
