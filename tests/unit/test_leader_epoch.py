"""Leader epoch cache: Kafka's LeaderEpochFileCache semantics, its checkpoint file, and how
the Log keeps it in step with appends, truncation, log start moves and recovery."""

import os

import pytest

from ottla.log import Log
from ottla.log.leader_epoch import (
    CHECKPOINT_FILE,
    EpochEntry,
    LeaderEpochCache,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    read_checkpoint,
)
from ottla.records.batch import parse_batches
from tests.unit.test_log import batch, config

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_with(tmp_path, *entries):
    cache = LeaderEpochCache(tmp_path)
    for epoch, offset in entries:
        cache.assign(epoch, offset)
    return cache


# -- the cache alone ---------------------------------------------------------------------


def test_end_offset_for_follows_kafka(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (4, 25))
    leo = 40
    assert cache.end_offset_for(4, leo) == (4, 40)  # latest epoch: the log end
    assert cache.end_offset_for(3, leo) == (3, 25)  # next epoch's start
    assert cache.end_offset_for(1, leo) == (1, 10)
    assert cache.end_offset_for(2, leo) == (1, 10)  # unknown epoch in between: the one below it
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than every entry: earliest start
    assert cache.end_offset_for(5, leo) == UNDEFINED  # newer than the latest
    assert cache.end_offset_for(UNDEFINED_EPOCH, leo) == UNDEFINED
    assert LeaderEpochCache(tmp_path / "x").end_offset_for(0, 0) == UNDEFINED  # empty


def test_assign_is_monotonic_and_removes_conflicting_entries(tmp_path):
    cache = cache_with(tmp_path, (0, 0), (0, 5), (2, 10))
    assert cache.entries == [(0, 0), (2, 10)]  # same epoch, later offset: nothing new
    assert not cache.assign(2, 12)
    assert not cache.assign(-1, 20)  # unstamped batches
    assert cache.assign(3, 8)  # starts before epoch 2 did: epoch 2 goes
    assert cache.entries == [(0, 0), (3, 8)]
    assert cache.assign(1, 3)  # an older epoch later in the log wipes what is newer
    assert cache.entries == [(0, 0), (1, 3)]


def test_truncation_from_both_ends(tmp_path):
    cache = cache_with(tmp_path, (0, 0), (1, 10), (2, 20), (3, 30))
    cache.truncate_from_end(31)
    assert cache.entries == [(0, 0), (1, 10), (2, 20), (3, 30)]
    cache.truncate_from_end(20)
    assert cache.entries == [(0, 0), (1, 10)]
    cache.truncate_from_start(5)
    assert cache.entries == [(0, 5), (1, 10)]
    cache.truncate_from_start(10)
    assert cache.entries == [(1, 10)]
    cache.truncate_from_start(15)
    assert cache.entries == [(1, 15)]


def test_an_assign_left_to_write_pending_is_written_newest_first_and_never_back(tmp_path):
    # A new leader's entry is written later (`Log.start_leader_epoch`); the owner's own writes
    # and a late `write_pending` always leave the newest entries in the file.
    cache = cache_with(tmp_path, (0, 0), (3, 10), (5, 20))
    path = tmp_path / CHECKPOINT_FILE
    assert cache.assign(6, 25, write=False)
    assert LeaderEpochCache.load(tmp_path)[0].entries == [(0, 0), (3, 10), (5, 20)]
    cache.write_pending()
    assert LeaderEpochCache.load(tmp_path)[0].entries == [(0, 0), (3, 10), (5, 20), (6, 25)]
    written = os.stat(path).st_ino
    cache.write_pending()  # nothing new: no write
    assert os.stat(path).st_ino == written
    assert cache.assign(7, 30, write=False)
    cache.truncate_from_end(28)  # the owner writes through, (7, 30) gone with the cut
    cache.write_pending()  # a late write finds nothing newer
    assert LeaderEpochCache.load(tmp_path)[0].entries == [(0, 0), (3, 10), (5, 20), (6, 25)]
    cache.assign(8, 28, write=False)
    cache.close()  # the partition was deleted: a late write writes nothing
    cache.write_pending()
    assert LeaderEpochCache.load(tmp_path)[0].entries == [(0, 0), (3, 10), (5, 20), (6, 25)]


def test_assign_ahead_writes_what_assign_makes_and_assign_then_writes_nothing(tmp_path):
    # A restarted follower's first fetched batches of new epochs fsync their
    # checkpoints in worker threads this way, so the assign on the event loop must find the
    # file current (the same file: no new inode).
    cache = cache_with(tmp_path, (0, 0), (3, 10), (5, 20))
    path = tmp_path / CHECKPOINT_FILE
    cache.assign_ahead(4, 15)()  # replaces the conflicting (5, 20), as assign will
    assert (path.read_text().split("\n")[1:-1], cache.entries) == (
        ["3", "0 0", "3 10", "4 15"], [(0, 0), (3, 10), (5, 20)])  # the cache itself unchanged
    written = os.stat(path).st_ino
    assert cache.assign(4, 15) and cache.entries == [(0, 0), (3, 10), (4, 15)]
    assert os.stat(path).st_ino == written
    assert cache.assign_ahead(4, 30) is None  # the current epoch again: nothing to write
    cache.truncate_from_end(12)  # anything else still writes through
    assert os.stat(path).st_ino != written and LeaderEpochCache.load(tmp_path)[0].entries == [(0, 0), (3, 10)]


def test_a_write_ahead_overtaken_by_a_change_writes_nothing(tmp_path):
    # A follower plans its fetched batch's new epoch, then (before the worker thread runs) a
    # LeaderAndIsr makes it leader at a newer epoch, which writes its own entry: the planned
    # write must not put the stale entries back over it.
    cache = cache_with(tmp_path, (0, 0), (3, 10))
    write = cache.assign_ahead(4, 15)
    assert cache.assign(6, 15)  # the new leadership, written through on the loop
    write()
    assert read_checkpoint(tmp_path / CHECKPOINT_FILE) == [(0, 0), (3, 10), (6, 15)] == cache.entries


def test_checkpoint_file_is_kafkas_format_and_reloads(tmp_path):
    cache_with(tmp_path, (0, 0), (4, 17))
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "0\n2\n0 0\n4 17\n"
    assert not (tmp_path / (CHECKPOINT_FILE + ".tmp")).exists()
    cache, usable = LeaderEpochCache.load(tmp_path)
    assert usable and cache.entries == [EpochEntry(0, 0), EpochEntry(4, 17)]


@pytest.mark.parametrize("text", ["1\n1\n0 0\n", "0\n2\n0 0\n", "0\n2\n3 5\n2 9\n", "garbage", "0\n1\n0 -4\n"])
def test_a_corrupt_checkpoint_is_reported_unusable(tmp_path, text):
    (tmp_path / CHECKPOINT_FILE).write_text(text)
    cache, usable = LeaderEpochCache.load(tmp_path)
    assert not usable and cache.entries == []


# -- wired into the log ------------------------------------------------------------------


def epochs_on_disk(log):
    data = log.read(log.log_start_offset, 1 << 30, max_offset=log.log_end_offset).records
    return [(h.base_offset, h.partition_leader_epoch) for h in parse_batches(data)]


def test_leader_appends_stamp_and_record_their_epoch(tmp_path):
    log = Log(tmp_path / "t-0", config())
    log.append(batch(2), now_ms=0, leader_epoch=0)
    log.append(batch(1), now_ms=0, leader_epoch=0)
    log.append(batch(3), now_ms=0, leader_epoch=2)
    log.append(batch(1), now_ms=0, leader_epoch=5)
    assert epochs_on_disk(log) == [(0, 0), (2, 0), (3, 2), (6, 5)]
    assert log.leader_epoch_cache.entries == [(0, 0), (2, 3), (5, 6)]
    assert log.end_offset_for_epoch(2) == (2, 6)
    assert log.end_offset_for_epoch(5) == (5, 7)
    assert (tmp_path / "t-0" / CHECKPOINT_FILE).read_text() == "0\n3\n0 0\n2 3\n5 6\n"


def test_follower_appends_record_the_epochs_of_replicated_batches(tmp_path):
    leader = Log(tmp_path / "l" / "t-0", config())
    for epoch in (0, 0, 1, 3, 3):
        leader.append(batch(2), now_ms=0, leader_epoch=epoch)
    follower = Log(tmp_path / "f" / "t-0", config())
    data = leader.read(0, 1 << 30, max_offset=leader.log_end_offset).records
    follower.append(bytes(data), now_ms=0, origin="replication")
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [(0, 0), (1, 4), (3, 6)]
    assert follower.log_end_offset == 10


def test_truncate_to_cuts_the_cache(tmp_path):
    log = Log(tmp_path / "t-0", config())
    for epoch in (0, 1, 1, 2):
        log.append(batch(2), now_ms=0, leader_epoch=epoch)
    log.truncate_to(6)
    assert log.leader_epoch_cache.entries == [(0, 0), (1, 2)]
    log.truncate_to(2)
    assert log.leader_epoch_cache.entries == [(0, 0)]
    log.append(batch(1), now_ms=0, leader_epoch=4)
    assert log.leader_epoch_cache.entries == [(0, 0), (4, 2)]
    log.truncate_to(0)  # fully: the log restarts empty
    assert log.leader_epoch_cache.entries == []


def test_log_start_moves_cut_the_cache(tmp_path):
    log = Log(tmp_path / "t-0", config(segment_bytes=200))
    for epoch in (0, 0, 1, 1, 2):
        log.append(batch(2), now_ms=0, leader_epoch=epoch)
    log.update_high_watermark(log.log_end_offset)
    log.delete_records_before(5)
    assert log.leader_epoch_cache.entries == [(1, 5), (2, 8)]
    log.delete_records_before(9)
    assert log.leader_epoch_cache.entries == [(2, 9)]


def test_clean_reopen_keeps_the_cache(tmp_path):
    log = Log(tmp_path / "t-0", config())
    for epoch in (0, 3):
        log.append(batch(2), now_ms=0, leader_epoch=epoch)
    log.close()
    again = Log(tmp_path / "t-0", config(), recovery_point=4, clean_shutdown=True)
    assert again.leader_epoch_cache.entries == [(0, 0), (3, 2)]


def test_recovery_cuts_entries_past_a_torn_tail(tmp_path):
    log = Log(tmp_path / "t-0", config())
    log.append(batch(2), now_ms=0, leader_epoch=0)
    log.append(batch(2), now_ms=0, leader_epoch=1)
    log.flush()
    log.append(batch(2), now_ms=0, leader_epoch=2)  # its entry is checkpointed, its bytes get torn
    path = log.active_segment.log_path
    os.truncate(path, os.path.getsize(path) - 5)
    recovered = Log(tmp_path / "t-0", config(), recovery_point=0)
    assert recovered.log_end_offset == 4
    assert recovered.leader_epoch_cache.entries == [(0, 0), (1, 2)]
    # A crash before anything else is appended: the next load cuts the same entry.
    again = Log(tmp_path / "t-0", config(), recovery_point=0)
    assert again.leader_epoch_cache.entries == [(0, 0), (1, 2)]
    # The cut is on disk before the first batch after it, here one that continues epoch 1 past
    # offset 4 (a file still saying "epoch 2 starts at 4" would then be wrong after a crash).
    again.append(batch(2), now_ms=0, leader_epoch=1)
    assert (tmp_path / "t-0" / CHECKPOINT_FILE).read_text() == "0\n2\n0 0\n1 2\n"
    crashed = Log(tmp_path / "t-0", config(), recovery_point=0)
    assert crashed.log_end_offset == 6
    assert crashed.leader_epoch_cache.entries == [(0, 0), (1, 2)]


def test_a_restart_that_changes_no_entry_writes_no_checkpoint(tmp_path):
    """An empty partition's entry starts at its log end: a load cuts it and the partition
    becoming leader again assigns it again. That round trip leaves the file alone (it cost
    two fsynced writes per empty partition at every start)."""
    log = Log(tmp_path / "t-0", config())
    log.leader_epoch_cache.assign(0, 0)
    log.close()
    path = tmp_path / "t-0" / CHECKPOINT_FILE
    written = os.stat(path).st_ino
    again = Log(tmp_path / "t-0", config(), recovery_point=0, clean_shutdown=True)
    assert again.leader_epoch_cache.entries == []  # cut to the empty log, as Kafka's LogLoader does
    again.leader_epoch_cache.assign(0, 0)  # becoming leader at epoch 0
    assert os.stat(path).st_ino == written  # every write replaces the file: none happened
    assert path.read_text() == "0\n1\n0 0\n"


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_a_lost_or_corrupt_checkpoint_is_rebuilt_from_the_batches(tmp_path, damage):
    log = Log(tmp_path / "t-0", config(segment_bytes=300))
    for epoch in (0, 0, 2, 2, 2, 7):
        log.append(batch(2), now_ms=0, leader_epoch=epoch)
    log.close()
    assert len(log.segments) > 2
    path = tmp_path / "t-0" / CHECKPOINT_FILE
    if damage == "delete":
        path.unlink()
    else:
        path.write_text("0\n9\n1 1\n")
    again = Log(tmp_path / "t-0", config(), recovery_point=12, clean_shutdown=True)
    assert again.leader_epoch_cache.entries == [(0, 0), (2, 4), (7, 10)]
    assert path.read_text() == "0\n3\n0 0\n2 4\n7 10\n"


@pytest.mark.parametrize("seed", range(12))
def test_the_cache_always_matches_the_batches_in_the_log(tmp_path, seed):
    """Random appends under rising epochs, truncations, log start moves and crash reopens:
    the cache always says what the log's own batches say (what a rebuild finds)."""
    import random

    from ottla.log.leader_epoch import entries_from_batches

    rng = random.Random(seed)
    directory = tmp_path / "t-0"
    log = Log(directory, config(segment_bytes=500))
    epoch = 0

    def rebuilt():
        headers = [h for s in log.segments for h in s.headers_from(0) if h.base_offset < log.log_end_offset]
        expected = LeaderEpochCache(tmp_path / "scratch")
        expected.replace(entries_from_batches(headers))
        expected.truncate_from_start(log.log_start_offset)
        return expected.entries

    def describing_data(entries):
        """Entries for epochs with data in the log: one that starts at the log end (the log
        start moved up to it) says nothing, and a reload drops it, as Kafka's does."""
        return [e for e in entries if e.start_offset < log.log_end_offset]

    (tmp_path / "scratch").mkdir()
    for _ in range(60):
        action = rng.choice(["append"] * 5 + ["epoch", "truncate", "start", "reopen"])
        if action == "append":
            log.append(batch(rng.randint(1, 3)), now_ms=0, leader_epoch=epoch)
        elif action == "epoch":
            epoch += rng.randint(1, 3)
        elif action == "truncate" and log.log_end_offset > log.log_start_offset:
            log.truncate_to(rng.randint(log.log_start_offset, log.log_end_offset))
        elif action == "start" and log.log_end_offset > log.log_start_offset:
            log.update_high_watermark(log.log_end_offset)
            log.delete_records_before(rng.randint(log.log_start_offset, log.log_end_offset))
        elif action == "reopen":
            log = Log(directory, config(segment_bytes=500), recovery_point=0,
                      log_start_offset=log.log_start_offset)
        assert describing_data(log.leader_epoch_cache.entries) == describing_data(rebuilt()), action


# -- a new leader's entry written after it leads (Log.start_leader_epoch) ------------------


class HeldWorker:
    """The real disk worker, held back: its jobs wait until `release`, the window in which a
    crash finds a new leader's checkpoint not written yet."""

    def __init__(self):
        import threading

        from ottla.log.disk_worker import DiskWorker

        self.worker = DiskWorker()
        self._event = threading.Event
        self.hold()

    def hold(self):
        self._gate = self._event()
        self.worker.submit("hold", self._gate.wait)

    def release(self):
        self._gate.set()
        self.worker.drain()
        self.hold()

    def close(self):
        self._gate.set()
        self.worker.close()


def crash(log):
    """What a kill -9 leaves: the files as they are, nothing the worker still had to do."""
    log.leader_epoch_cache.close()


def test_a_new_leaders_entry_is_written_by_the_worker_not_on_the_way_to_leading(tmp_path):
    held = HeldWorker()
    try:
        log = Log(tmp_path / "t-0", config(), disk_worker=held.worker)
        log.append(batch(2), now_ms=0, leader_epoch=0)
        log.start_leader_epoch(3)
        assert log.leader_epoch_cache.entries == [(0, 0), (3, 2)]
        assert LeaderEpochCache.load(tmp_path / "t-0")[0].entries == [(0, 0)]  # not yet
        held.release()
        assert LeaderEpochCache.load(tmp_path / "t-0")[0].entries == [(0, 0), (3, 2)]
    finally:
        held.close()


@pytest.mark.parametrize("then", ["appended", "nothing appended"])
def test_a_crash_before_the_new_leaders_entry_was_written_recovers_it_from_the_batches(tmp_path, then):
    """The stale checkpoint of seed 001's divergence schedule: B leads epoch 1 from offset 1 and
    takes m2 there, then crashes before its checkpoint says so. After recovery B must answer a
    follower asking for epoch 0 with offset 1 (where epoch 0 ended), or a follower holding
    another m1 at offset 1 keeps it: the replicas diverge."""
    held = HeldWorker()
    try:
        log = Log(tmp_path / "t-0", config(), disk_worker=held.worker)
        log.append(batch(1), now_ms=0, leader_epoch=0)  # m0
        log.flush()
        log.start_leader_epoch(1)
        if then == "appended":
            log.append(batch(1), now_ms=0, leader_epoch=1)  # m2
        checkpointed = log.recovery_point  # what the recovery-point checkpoint may hold
        crash(log)
        assert LeaderEpochCache.load(tmp_path / "t-0")[0].entries == [(0, 0)]  # the window
        recovered = Log(tmp_path / "t-0", config(), disk_worker=held.worker, recovery_point=checkpointed)
        if then == "appended":
            assert recovered.leader_epoch_cache.entries == [(0, 0), (1, 1)]
            assert LeaderEpochCache.load(tmp_path / "t-0")[0].entries == [(0, 0), (1, 1)]  # written at once
            recovered.start_leader_epoch(2)  # B leads again after its restart
            assert recovered.end_offset_for_epoch(0) == (0, 1)
        else:  # the epoch holds no batch: as if it had never been assigned (Kafka's load cuts it too)
            assert recovered.leader_epoch_cache.entries == [(0, 0)]
    finally:
        held.close()


def test_the_recovery_point_never_passes_an_unwritten_entry(tmp_path, monkeypatch):
    """A flush and a roll's fsync (in the worker) move the recovery point: the entry is written
    first, else a crash after the next recovery-point checkpoint would not scan its batches.
    Here the worker's own write of it never comes (the broker's failpoint)."""
    from ottla.log import log as log_module

    monkeypatch.setattr(log_module, "_HOLD_LEADER_EPOCH_WRITE", True)
    held = HeldWorker()
    path = tmp_path / "t-0"
    try:
        log = Log(path, config(segment_bytes=600), disk_worker=held.worker)
        log.append(batch(1), now_ms=0, leader_epoch=0)
        log.start_leader_epoch(1)
        log.append(batch(1), now_ms=0, leader_epoch=1)
        held.release()
        assert LeaderEpochCache.load(path)[0].entries == [(0, 0)]
        log.flush()
        assert log.recovery_point == 2 and LeaderEpochCache.load(path)[0].entries == [(0, 0), (1, 1)]
        log.start_leader_epoch(2)
        while len(log.segments) < 3:
            log.append(batch(2), now_ms=0, leader_epoch=2)
        held.release()  # the rolls' fsyncs ran and the recovery point moved past offset 2
        assert log.recovery_point > 2
        assert LeaderEpochCache.load(path)[0].entries == [(0, 0), (1, 1), (2, 2)]
    finally:
        held.close()


def test_a_new_leader_below_an_earlier_recovery_point_writes_its_entry_at_once(tmp_path):
    """After a truncation below the recovery point the checkpointed one may still be higher,
    and a crash would not scan the new epoch's batches: then the entry is written first."""
    held = HeldWorker()
    path = tmp_path / "t-0"
    try:
        log = Log(path, config(), disk_worker=held.worker)
        for _ in range(3):
            log.append(batch(1), now_ms=0, leader_epoch=0)
        log.flush()
        log.truncate_to(1)
        log.start_leader_epoch(4)
        assert LeaderEpochCache.load(path)[0].entries == [(0, 0), (4, 1)]
    finally:
        held.close()


@pytest.mark.parametrize("seed", range(12))
def test_with_entries_written_late_the_cache_always_matches_the_batches_after_a_crash(tmp_path, seed):
    """Random leaderships (entries left to the held worker), appends, rolls, flushes,
    truncations, the worker catching up, and crashes that keep any recovery point the log had
    since its last one (the checkpoint is periodic): after every step, and above all after
    each crash's recovery, the cache says what the batches in the log say."""
    import random

    from ottla.log.leader_epoch import entries_from_batches

    rng = random.Random(seed)
    directory = tmp_path / "t-0"
    held = HeldWorker()
    try:
        log = Log(directory, config(segment_bytes=400), disk_worker=held.worker)
        checkpoints = [0]
        epoch = 0

        def expected():
            headers = [h for s in log.segments for h in s.headers_from(0) if h.base_offset < log.log_end_offset]
            return entries_from_batches(headers)

        for _ in range(80):
            action = rng.choice(["append"] * 6 + ["lead", "lead", "flush", "truncate", "release", "crash"])
            if action == "append":
                log.append(batch(rng.randint(1, 3)), now_ms=0, leader_epoch=epoch)
            elif action == "lead":
                epoch += rng.randint(1, 2)
                log.start_leader_epoch(epoch)
            elif action == "flush":
                log.flush()
            elif action == "truncate" and log.log_end_offset > 0:
                log.truncate_to(rng.randint(0, log.log_end_offset))
            elif action == "release":
                held.release()
            elif action == "crash":
                crash(log)
                log = Log(directory, config(segment_bytes=400), disk_worker=held.worker,
                          recovery_point=rng.choice(checkpoints))
                checkpoints = []
            checkpoints.append(log.recovery_point)
            assert [e for e in log.leader_epoch_cache.entries if e.start_offset < log.log_end_offset] == expected(), action
    finally:
        held.close()
