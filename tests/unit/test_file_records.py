"""Lazy fetch reads (log/file_records.py): the same bytes as an eager read, and a clear
failure, never other bytes, when the segment changed before the socket took them."""

import pytest

from ottla.log import Log
from ottla.log.file_records import LAZY_MIN_BYTES, FileRecords, RecordsGone
from tests.unit.test_log import batch, config


def _bytes(records) -> bytes:
    return records.read(0, len(records)) if isinstance(records, FileRecords) else bytes(records)


@pytest.mark.parametrize("interval", [0, 4096, 1 << 20])
def test_lazy_reads_return_exactly_what_eager_reads_return(tmp_path, interval):
    log = Log(tmp_path / "t-0", config(index_interval_bytes=interval))
    for n in range(1, 60):
        log.append(batch(n % 7 + 1, value=bytes([n]) * (n * 300)), now_ms=0)
    log.update_high_watermark(log.log_end_offset)
    end = log.log_end_offset
    lazy_seen = 0
    for offset in (0, 1, 17, 100, end - 1, end):
        for max_bytes in (10, 5_000, LAZY_MIN_BYTES, 300_000, 1 << 30):
            for max_offset in (offset, offset + 3, end // 2, end):
                for min_one in (True, False):
                    eager = log.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one).records
                    lazy = log.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one, lazy=True).records
                    assert _bytes(lazy) == bytes(eager), (offset, max_bytes, max_offset, min_one)
                    lazy_seen += isinstance(lazy, FileRecords)
    assert lazy_seen  # large reads did stay in the file


def _lazily_read(tmp_path, log=None) -> FileRecords:
    """All of a log of 20 batches of 10 records, as a FileRecords (a new log unless `log`)."""
    log = log or Log(tmp_path / "t-0", config())
    for _ in range(20):
        log.append(batch(10, value=b"x" * 1000), now_ms=0)
    log.update_high_watermark(log.log_end_offset)
    records = log.read(0, 1 << 20, max_offset=log.log_end_offset, lazy=True).records
    assert isinstance(records, FileRecords)
    return records


def test_a_truncated_segment_is_never_sent(tmp_path):
    log = Log(tmp_path / "t-0", config())
    records = _lazily_read(tmp_path, log)
    log.truncate_to(100)
    for _ in range(10):  # as many other bytes where the old ones were
        log.append(batch(10, value=b"y" * 1000), now_ms=0)
    with pytest.raises(RecordsGone):
        records.read(0, len(records))


def test_a_deleted_segment_is_never_sent(tmp_path):
    log = Log(tmp_path / "t-0", config())
    for _ in range(20):
        log.append(batch(10, value=b"x" * 1000), now_ms=0)
    log.update_high_watermark(log.log_end_offset)
    records = log.read(0, 1 << 20, max_offset=log.log_end_offset, lazy=True).records
    log.truncate_fully_and_start_at(500)
    with pytest.raises(RecordsGone):
        records.read(0, 1024)


def test_a_file_system_without_nowait_reads_leaves_the_read_to_the_worker(tmp_path, monkeypatch):
    """preadv's RWF_NOWAIT is refused by some file systems (EOPNOTSUPP): that is "not known to
    be cached" (read in a worker thread), never a response cut short."""
    import errno
    import os

    records = _lazily_read(tmp_path)

    def refused(*_):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(os, "preadv", refused)
    assert records.read_cached(0, 4096) is None
    assert records.checked(records.detached_read(0, 4096)(), 4096) == records.read(0, 4096)
