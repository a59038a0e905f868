"""The log cleaner on real files, driven with explicit time and no threads: what survives a
clean, offsets, tombstones and delete horizons, transactions, producer state, and the swap's
crash safety (a "crash" raises at a failpoint and the directory is reopened as it was left)."""

from __future__ import annotations

import threading
import time

import pytest

from ottla.config import BrokerConfig
from ottla.log import LogManager
from ottla.log.cleaner import service, swap
from ottla.log.cleaner.clean import CleaningAborted
from ottla.log.cleaner.filter import DELETE_HORIZON_BIT, delete_horizon
from ottla.log.cleaner.service import CLEANER_CHECKPOINT_FILE, LogCleaner
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch, iter_batches

NOW = 1_700_000_000_000
DAY = 86_400_000
def INLINE(function):
    return function()


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


def setup(tmp_path, clock, topic_config=None, broker_config=None):
    manager = LogManager(tmp_path, BrokerConfig(broker_config or {}), clock=clock)
    config = {"cleanup.policy": "compact", "segment.bytes": "2048"}
    config.update(topic_config or {})
    manager.create_topic("t", 1, config)
    return manager, LogCleaner(manager, manager.broker_config, clock=clock)


def append(log, data, now_ms, **kwargs):
    """Append and move the high watermark along, as the replica manager does on one node."""
    result = log.append(data, now_ms=now_ms, **kwargs)
    log.update_high_watermark(log.log_end_offset)
    return result


def put(log, key, value, clock, **batch_args):
    records = [Record(key, value, (), clock.now)]
    return append(log, build_batch(records, now_ms=clock.now, **batch_args), clock.now)


def contents(log):
    """(offset, key, value, batch header) of every record, reading the segment files."""
    out = []
    for segment in log.segments:
        for header, records in iter_batches(segment.log_path.read_bytes()):
            out += [(r.offset, r.key, r.value, header) for r in records]
    return out


def latest(log):
    return {key: (offset, value) for offset, key, value, _ in contents(log)}


def fill(log, clock, updates=600, keys=40, prefix=b"key"):
    expected = {}
    for i in range(updates):
        key = b"%s-%d" % (prefix, i % keys)
        value = b"value-%d" % i
        expected[key] = (put(log, key, value, clock).base_offset, value)
    return expected


def test_only_the_latest_value_of_each_key_survives_with_its_offset(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock)
    log = manager.get_log("t", 0)
    expected = fill(log, clock)
    segments_before = len(log.segments)
    active_before = log.active_segment.log_path.read_bytes()
    assert segments_before > 10

    result = cleaner.clean_once(INLINE)
    assert result is not None and result.records_read == log.active_segment.base_offset

    records = contents(log)
    offsets = [o for o, *_ in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert latest(log) == expected
    # Only the active segment may still hold superseded values.
    sealed = [(o, k) for o, k, _, _ in records if o < log.active_segment.base_offset]
    assert len(sealed) == len({k for _, k in sealed})
    assert log.active_segment.log_path.read_bytes() == active_before
    assert len(log.segments) == segments_before  # grouped by their size before cleaning, as Kafka does
    assert log.log_end_offset == 600
    # The next pass has nothing dirty to do.
    assert cleaner.clean_once(INLINE) is None
    # Once more is dirty, the now small cleaned segments are merged.
    expected.update(fill(log, clock, updates=300))
    segments_before = len(log.segments)
    assert cleaner.clean_once(INLINE) is not None
    assert len(log.segments) < segments_before - 10
    assert latest(log) == expected
    assert (tmp_path / CLEANER_CHECKPOINT_FILE).read_text().splitlines()[2] == f"t 0 {log.active_segment.base_offset}"

    # Fetches still find every surviving offset.
    first = log.read(0, 1 << 20, max_offset=log.high_watermark)
    assert first.records
    manager.close()
    reopened = LogManager(tmp_path, BrokerConfig(), clock=clock).get_log("t", 0)
    assert latest(reopened) == expected


def test_tombstones_stay_for_delete_retention_after_first_clean_then_go(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"delete.retention.ms": "1000"})
    log = manager.get_log("t", 0)
    expected = fill(log, clock, updates=300, keys=20)
    for i in range(5):
        put(log, b"key-%d" % i, None, clock)
    fill_more = fill(log, clock, updates=200, keys=1000, prefix=b"more")  # new keys roll the tombstones out of the active segment
    cleaner.clean_once(INLINE)
    state = latest(log)
    for i in range(5):
        assert state[b"key-%d" % i][1] is None  # the tombstone is still there
    tombstone_batches = [h for _, k, v, h in contents(log) if v is None]
    assert tombstone_batches and all(h.attributes & DELETE_HORIZON_BIT for h in tombstone_batches)
    assert all(h.first_timestamp == NOW + 1000 for h in tombstone_batches)

    clock.now += 999
    assert cleaner.clean_once(INLINE) is None  # nothing dirty and the horizon is still ahead
    clock.now += 2
    assert cleaner.clean_once(INLINE) is not None  # the horizon passing makes the log due
    state = latest(log)
    for i in range(20):
        key = b"key-%d" % i
        assert (key in state) == (i >= 5)
        if i >= 5:
            assert state[key] == expected[key]
    for key, value in fill_more.items():
        assert state[key] == value


def test_record_timestamps_survive_the_horizon_rewrite(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock)
    log = manager.get_log("t", 0)
    records = [Record(b"a", b"1", (), NOW - 5000), Record(b"b", None, (("h", b"x"),), NOW - 4000),
               Record(b"c", b"3", (), NOW - 3000)]
    append(log, build_batch(records, compression="gzip"), clock.now)
    fill(log, clock, updates=100, keys=100, prefix=b"more")
    cleaner.clean_once(INLINE)
    header, decoded = next(iter_batches(log.segments[0].log_path.read_bytes()))
    assert header.attributes & DELETE_HORIZON_BIT and header.compression == 1
    assert [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in decoded] == [
        (b"a", b"1", (), NOW - 5000, 0), (b"b", None, (("h", b"x"),), NOW - 4000, 1), (b"c", b"3", (), NOW - 3000, 2)]


def test_min_compaction_lag_and_lso_bound_what_is_cleaned(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"min.compaction.lag.ms": "60000"})
    log = manager.get_log("t", 0)
    fill(log, clock)
    assert cleaner.clean_once(INLINE) is None  # every record is younger than the lag
    clock.now += 60_001
    assert cleaner.clean_once(INLINE) is not None


def _txn(log, pid, epoch, seq, key, value, clock):
    return append(log, build_batch([Record(key, value, (), clock.now)], producer_id=pid, producer_epoch=epoch,
                                   base_sequence=seq, is_transactional=True, now_ms=clock.now), clock.now)


def _marker(log, pid, epoch, commit, clock):
    return append(log, build_control_batch(pid, epoch, 0, commit, clock.now), clock.now, origin="coordinator")


def test_transactions_aborted_removed_open_untouched_markers_kept_until_safe(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"delete.retention.ms": "1000"})
    log = manager.get_log("t", 0)
    committed = _txn(log, 1000, 0, 0, b"c", b"committed", clock).base_offset
    commit_marker = _marker(log, 1000, 0, True, clock).base_offset
    aborted = _txn(log, 2000, 0, 0, b"a", b"aborted", clock).base_offset
    abort_marker = _marker(log, 2000, 0, False, clock).base_offset
    fill(log, clock, updates=200, keys=200)
    open_offset = _txn(log, 3000, 0, 0, b"o", b"open", clock).base_offset
    fill(log, clock, updates=200, keys=200)  # the open transaction's batch is in a sealed segment now
    assert log.last_stable_offset == open_offset
    open_before = [(o, k, v) for o, k, v, _ in contents(log) if o >= open_offset]

    cleaner.clean_once(INLINE)
    records = {o: (k, v, h) for o, k, v, h in contents(log)}
    assert committed in records and commit_marker in records
    assert aborted not in records  # the aborted transaction's data is gone
    assert abort_marker in records  # its marker stays while its data was just removed
    assert [(o, k, v) for o, k, v, _ in contents(log) if o >= open_offset] == open_before
    # read_committed still learns about the abort from the kept index entry
    assert [t.producer_id for s in log.segments for t in s.txn_index.entries] == [2000]

    _marker(log, 3000, 0, True, clock)
    # While the aborted batch is producer 2000's last, it stays (emptied) and so does the
    # marker, as in Kafka; a later transaction of the producer lets both go.
    _txn(log, 2000, 0, 1, b"a2", b"later", clock)
    _marker(log, 2000, 0, True, clock)
    for _ in range(4):  # the marker gets its horizon once no data of its transaction is left
        fill(log, clock, updates=200, keys=200)
        clock.now += 1001
        cleaner.clean_once(INLINE)
    records = {o: (k, v, h) for o, k, v, h in contents(log)}
    assert abort_marker not in records
    assert b"committed" in [v for k, v, _ in records.values()]
    assert log.last_stable_offset == log.high_watermark


def test_producer_last_batch_kept_empty_so_retries_stay_deduplicated(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock)
    log = manager.get_log("t", 0)
    first = build_batch([Record(b"key-0", b"old", (), NOW)], producer_id=7, producer_epoch=0, base_sequence=0, now_ms=NOW)
    append(log, first, NOW)
    last = build_batch([Record(b"key-0", b"new", (), NOW)], producer_id=7, producer_epoch=0, base_sequence=1, now_ms=NOW)
    original = append(log, last, NOW)
    fill(log, clock, updates=100, keys=1)
    fill(log, clock, updates=100, keys=100)
    cleaner.clean_once(INLINE)
    headers = {h.base_offset: h for _, _, _, h in contents(log)}
    batches = [h for seg in log.segments for h in seg.headers_from(0) if h.producer_id == 7]
    assert [(b.base_offset, b.records_count, b.base_sequence) for b in batches] == [(original.base_offset, 0, 1)]
    assert original.base_offset not in headers  # no record survives in it
    manager.close()
    log = LogManager(tmp_path, BrokerConfig(), clock=clock).get_log("t", 0)
    retry = append(log, last, NOW)
    assert retry.duplicate and retry.base_offset == original.base_offset


@pytest.mark.parametrize("failpoint", ["cleaner.after_cleaned", *swap.FAILPOINTS[1:]])
def test_a_crash_at_any_step_of_the_swap_leaves_old_or_new(tmp_path, monkeypatch, failpoint):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock)
    log = manager.get_log("t", 0)
    expected = fill(log, clock)
    before = contents(log)

    class Crash(BaseException):
        pass

    def crash(name, failpoints):
        if name == failpoint:
            raise Crash(name)

    monkeypatch.setattr(swap, "crash_at", crash)
    monkeypatch.setattr("ottla.log.cleaner.service.crash_at", crash)
    with pytest.raises(Crash):
        cleaner.clean_once(INLINE)
    # The process "dies" here: reopen the directory as the crash left it (no clean shutdown).
    reopened = LogManager(tmp_path, BrokerConfig(), clock=clock).get_log("t", 0)
    after = contents(reopened)
    assert latest(reopened) == expected
    old = [(o, k, v) for o, k, v, _ in before]
    new = [(o, k, v) for o, k, v, _ in after]
    committed = failpoint != "cleaner.after_cleaned"
    assert (new != old) == committed
    names = [p.name for p in (tmp_path / "t-0").iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    assert reopened.log_end_offset == 600


def test_a_log_changed_under_the_pass_is_not_swapped(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"cleanup.policy": "compact,delete", "retention.bytes": "4000"})
    log = manager.get_log("t", 0)
    fill(log, clock)
    grabbed = cleaner._grab()
    from ottla.log.cleaner.clean import Throttler, clean
    from ottla.log.cleaner.filter import OffsetMap

    result = clean(grabbed.task, OffsetMap(1 << 20), Throttler(float("inf")), lambda: None)
    assert log.apply_retention(clock.now) > 0  # retention deletes segments the pass read
    before = contents(log)
    with pytest.raises(CleaningAborted):
        cleaner._commit(grabbed, result)
    assert contents(log) == before


def test_a_full_offset_map_cleans_in_several_passes(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, broker_config={"log.cleaner.dedupe.buffer.size": str(24 * 60)})
    log = manager.get_log("t", 0)
    expected = fill(log, clock, updates=1000, keys=200)
    passes = 0
    while cleaner.clean_once(INLINE) is not None:
        passes += 1
        assert passes < 50
    assert passes > 1
    assert latest(log) == expected


def test_delete_and_compact_applies_both_policies(tmp_path):
    clock = Clock()
    clock.now = int(time.time() * 1000)  # segments emptied by cleaning age by their file time, as in Kafka
    manager, cleaner = setup(tmp_path, clock, {"cleanup.policy": "delete,compact", "retention.ms": "60000"})
    log = manager.get_log("t", 0)
    fill(log, clock, updates=300, keys=20, prefix=b"old")
    clock.now += 120_000
    expected = fill(log, clock, updates=300, keys=20, prefix=b"new")
    assert cleaner.clean_once(INLINE) is not None
    state = latest(log)
    assert len([o for o, k, _, _ in contents(log) if o < log.active_segment.base_offset]) < 100  # compacted
    assert log.apply_retention(clock.now) > 0  # and the old keys' segments are past retention.ms
    state = latest(log)
    assert not [k for k in state if k.startswith(b"old")]
    assert {k: v for k, v in state.items()} == expected


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "after-a-restart"])
def test_a_recreated_topic_does_not_inherit_the_old_checkpoint(tmp_path, restart):
    """After a restart too: the old topic's entry must have left cleaner-offset-checkpoint
    (Kafka updates it when it deletes a log), else the new log's records below it count as
    cleaned and keep every duplicate for good."""
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock)
    fill(manager.get_log("t", 0), clock, updates=1500)
    assert cleaner.clean_once(INLINE) is not None
    manager.delete_topic("t")
    manager.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": "2048"})
    log = manager.get_log("t", 0)
    expected = fill(log, clock, updates=1000, prefix=b"a")  # below where the old log's checkpoint was...
    expected.update(fill(log, clock, updates=1000, prefix=b"b"))  # ...and past it, with other keys
    if restart:
        manager.close()
        manager = LogManager(tmp_path, BrokerConfig(), clock=clock)
        cleaner = LogCleaner(manager, manager.broker_config, clock=clock)
        log = manager.get_log("t", 0)
    assert cleaner.clean_once(INLINE) is not None
    sealed = [k for o, k, _, _ in contents(log) if o < log.active_segment.base_offset]
    assert len(sealed) == len(set(sealed))  # everything was cleaned, not only what lay past the old checkpoint
    assert latest(log) == expected


@pytest.mark.parametrize("min_ratio", [0.3, 0.7])
def test_a_log_is_cleaned_only_once_its_dirty_ratio_passes_min_cleanable_dirty_ratio(tmp_path, min_ratio):
    """Kafka's LogCleanerManager: dirty bytes (from the cleaner checkpoint to the active
    segment) over clean plus dirty bytes must exceed `min.cleanable.dirty.ratio`."""
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"min.cleanable.dirty.ratio": str(min_ratio)})
    log = manager.get_log("t", 0)
    fill(log, clock, keys=200)  # the clean section: 200 live keys, several segments
    assert cleaner.clean_once(INLINE) is not None
    first_dirty = log.active_segment.base_offset  # the checkpoint: cleaned up to the active segment
    below_seen = 0
    for i in range(2000):
        put(log, b"key-%d" % (i % 200), b"again-%d" % i, clock)
        sealed = list(zip(log.segments, log.segments[1:]))
        clean = sum(s.size for s, following in sealed if following.base_offset <= first_dirty)
        dirty = sum(s.size for s, _ in sealed if s.base_offset >= first_dirty)
        ratio = dirty / (clean + dirty)
        result = cleaner.clean_once(INLINE)
        if ratio <= min_ratio:
            assert result is None, f"cleaned at dirty ratio {ratio:.2f}"
            below_seen += dirty > 0
        else:
            assert result is not None, f"not cleaned at dirty ratio {ratio:.2f}"
            break
    else:
        raise AssertionError("the dirty ratio never passed the minimum")
    assert below_seen > 0  # there was dirty data below the ratio, and it was left alone


def test_max_compaction_lag_cleans_a_log_its_dirty_ratio_never_would(tmp_path):
    """`max.compaction.lag.ms`: once the oldest dirty record is older than the lag, the log is
    cleaned whatever its dirty ratio (here a ratio that is never exceeded)."""
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"min.cleanable.dirty.ratio": "1.0", "max.compaction.lag.ms": "60000"})
    log = manager.get_log("t", 0)
    expected = fill(log, clock)
    clock.now += 60_000
    assert cleaner.clean_once(INLINE) is None  # exactly the lag old: not yet
    clock.now += 1
    assert cleaner.clean_once(INLINE) is not None
    assert latest(log) == expected
    sealed = [k for o, k, _, _ in contents(log) if o < log.active_segment.base_offset]
    assert len(sealed) == len(set(sealed))


@pytest.mark.parametrize("enable, threads, started", [("true", "2", 2), ("false", "2", 0), ("true", "0", 0)])
def test_log_cleaner_enable_and_threads_decide_the_threads_started(tmp_path, enable, threads, started):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, broker_config={"log.cleaner.enable": enable,
                                                             "log.cleaner.threads": threads})
    cleaner.start(INLINE)
    try:
        running = [t for t in threading.enumerate() if t.name.startswith("kafka-log-cleaner-thread-")]
        assert len(running) == started
    finally:
        cleaner.stop()


def test_an_idle_cleaner_thread_waits_log_cleaner_backoff_ms(tmp_path):
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, broker_config={"log.cleaner.backoff.ms": "1234"})
    waits = []

    class Stop(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            self.set()
            return True

    cleaner._stop = Stop()
    cleaner._run(INLINE)  # the only log has nothing to clean: one empty pass, then the backoff
    assert waits == [1.234]


def test_log_cleaner_io_max_bytes_per_second_paces_a_pass(tmp_path, monkeypatch):
    """Every byte a pass reads and writes goes through the throttler made from the setting,
    which (as Kafka's Throttler) checks the rate each time a 300 ms window has passed and
    sleeps enough to bring it down. On a virtual clock (each look at it costs 20 ms of work),
    by every check the pass has taken at least the bytes seen so far over the rate."""
    rate = 20_000
    now = [0.0]
    made = []

    looks = [0]

    def tick():
        looks[0] += 1
        now[0] += 0.02
        return now[0]

    def sleep(seconds):
        now[0] += seconds

    class Counting(service.Throttler):
        def __init__(self, bytes_per_second):
            super().__init__(bytes_per_second, tick, sleep)
            self.moved = 0
            self.checks = []  # (bytes so far, virtual time) after each check
            made.append(self)

        def throttle(self, size):
            self.moved += size
            super().throttle(size)
            if self._count == 0:
                self.checks.append((self.moved, now[0]))

    monkeypatch.setattr(service, "Throttler", Counting)
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, broker_config={"log.cleaner.io.max.bytes.per.second": str(rate)})
    fill(manager.get_log("t", 0), clock)
    started = now[0]
    assert cleaner.clean_once(INLINE) is not None
    throttler = made[-1]
    assert throttler.rate == rate
    checked, _ = throttler.checks[-1]
    assert checked > throttler.moved / 2
    assert checked / rate > 2 * looks[0] * 0.02  # the work alone would not take that long
    for moved, when in throttler.checks:
        assert when - started >= moved / rate - 1e-9


def test_a_commit_marker_stays_delete_retention_ms_after_its_data_was_cleaned_away(tmp_path):
    """Kafka's rule for markers: kept while its transaction's data is in the log; the first
    clean that finds none of it stamps a horizon (now + delete.retention.ms); dropped by the
    first clean at or past it (the producer's later transaction keeps it from being its last)."""
    clock = Clock()
    manager, cleaner = setup(tmp_path, clock, {"delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.01"})
    log = manager.get_log("t", 0)
    _txn(log, 1000, 0, 0, b"c", b"committed", clock)
    marker = _marker(log, 1000, 0, True, clock).base_offset
    _txn(log, 1000, 0, 1, b"x", b"later", clock)
    _marker(log, 1000, 0, True, clock)
    put(log, b"c", b"overwritten", clock)

    def marker_horizon():
        found = [h for s in log.segments for h in s.headers_from(0) if h.base_offset == marker]
        return delete_horizon(found[0]) if found else "gone"

    def clean_at(now, step):
        clock.now = now
        fill(log, clock, updates=200, keys=200, prefix=b"f%d" % step)  # something dirty to clean
        assert cleaner.clean_once(INLINE) is not None

    clean_at(NOW, 0)
    assert latest(log)[b"c"][1] == b"overwritten"  # the transaction's data went in this pass...
    assert marker_horizon() is None  # ...so its marker stays, with no horizon yet
    clean_at(NOW + 400, 1)
    assert marker_horizon() == NOW + 1400
    clean_at(NOW + 1399, 2)
    assert marker_horizon() == NOW + 1400
    clean_at(NOW + 1400, 3)
    assert marker_horizon() == "gone"
