"""ProducerStateManager on disk: snapshots, reload after restart, corrupt snapshots, truncation."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.producer_state import (
    BatchMetadata,
    CompletedTxn,
    ControlBatch,
    ProducerEntry,
    ProducerStateManager,
)
from ottla.producer_state import snapshot as snapshot_file
from tests.unit.producer_batches import NOW, data, marker



def _header(item):
    return item.header if isinstance(item, ControlBatch) else item


class FakeLog:
    """Just enough of a log: the batches in offset order, and a replay that records its calls."""

    def __init__(self, state):
        self.state = state
        self.items = []
        self.replayed_from = []

    @property
    def end_offset(self):
        return _header(self.items[-1]).last_offset + 1 if self.items else 0

    def append(self, item, origin="client", now=NOW):
        assert _header(item).base_offset == self.end_offset
        completed = self.state.apply(self.state.validate([item], now, origin))
        self.items.append(item)
        return completed

    def truncate(self, offset):
        self.items = [i for i in self.items if _header(i).base_offset < offset]

    def replay(self, start):
        self.replayed_from.append(start)
        return iter(list(self.items))  # whole "segments": the manager skips what is below start


def view(state):
    """Everything observable about the state, for comparing two managers."""
    return (
        {p.producer_id: state.entry(p.producer_id) for p in state.active_producers()},
        state.first_unstable_offset(),
    )


def reopen(log_dir, log, log_start=0, **kwargs):
    state = ProducerStateManager(log_dir, **kwargs)
    log.state = state
    state.truncate_and_reload(log_start, log.end_offset, log.replay)
    return state


def populate(log):
    """Idempotent and transactional traffic with an epoch bump, leaving one transaction open."""
    for i in range(7):
        log.append(data(1, 0, i * 2, log.end_offset, count=2))
    log.append(data(2, 0, 0, log.end_offset, txn=True))
    log.append(data(3, 0, 0, log.end_offset, count=3, txn=True))
    log.append(marker(2, 0, log.end_offset, coordinator_epoch=1), origin="coordinator")
    log.append(data(1, 1, 0, log.end_offset))
    log.append(data(3, 0, 3, log.end_offset, txn=True))


def test_snapshot_file_name_and_reload_without_replay(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    populate(log)
    state.take_snapshot(log.end_offset)
    assert [p.name for p in tmp_path.iterdir()] == [f"{log.end_offset:020d}.snapshot"]

    reloaded = reopen(tmp_path, log)
    assert log.replayed_from == [log.end_offset]
    assert view(reloaded) == view(state)
    assert reloaded.first_unstable_offset() == 15  # producer 3's transaction survives the restart


def test_a_snapshot_of_an_unchanged_state_is_not_written_again(tmp_path):
    """Kafka's takeSnapshot: a clean restart of a partition nothing was appended to keeps the
    snapshot it loaded (it rewrote it, with two fsyncs, at every shutdown); any change since,
    a batch or an expiry, is written."""
    state = ProducerStateManager(tmp_path, expiration_ms=1000)
    log = FakeLog(state)
    populate(log)
    state.take_snapshot(log.end_offset)
    path = snapshot_file.snapshot_path(tmp_path, log.end_offset)
    written = os.stat(path).st_ino

    reloaded = reopen(tmp_path, log, expiration_ms=1000)
    reloaded.take_snapshot(log.end_offset)
    assert os.stat(path).st_ino == written  # every write replaces the file: none happened
    assert reloaded.remove_expired(NOW + 10_000) > 0  # producers without an open transaction go
    reloaded.take_snapshot(log.end_offset)
    assert os.stat(path).st_ino != written
    assert view(reopen(tmp_path, log, expiration_ms=1000)) == view(reloaded)

    log.append(data(4, 0, 0, log.end_offset))
    log.state.take_snapshot(log.end_offset)
    assert snapshot_file.snapshot_path(tmp_path, log.end_offset).exists()


def test_all_five_batches_survive_a_restart(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    for i in range(6):
        log.append(data(1, 0, i, i))
    state.take_snapshot(log.end_offset)
    reloaded = reopen(tmp_path, log)
    for seq in range(1, 6):
        assert reloaded.validate([data(1, 0, seq, 6)], NOW).duplicate == BatchMetadata(seq, seq, seq, seq, NOW)
    with pytest.raises(KafkaError) as info:
        reloaded.validate([data(1, 0, 0, 6)], NOW)
    assert info.value.code == ErrorCode.out_of_order_sequence_number


def test_replay_after_the_snapshot_rebuilds_the_same_state(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    for i in range(3):
        log.append(data(9, 0, i, i))
    state.take_snapshot(log.end_offset)
    populate(log)

    reloaded = reopen(tmp_path, log)
    assert log.replayed_from == [3]
    assert view(reloaded) == view(state)
    assert reloaded.map_end_offset == log.end_offset


def test_reload_without_any_snapshot_replays_from_the_log_start(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    populate(log)
    reloaded = reopen(tmp_path, log)
    assert log.replayed_from == [0]
    assert view(reloaded) == view(state)


def test_replay_reports_the_transactions_it_completes(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0, txn=True))
    log.append(marker(1, 0, 1, abort=True), origin="coordinator")
    fresh = ProducerStateManager(tmp_path)
    assert fresh.truncate_and_reload(0, log.end_offset, log.replay) == [CompletedTxn(1, 0, 1, True)]


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-3],
        lambda b: b[:6] + bytes([b[6] ^ 0x01]) + b[7:],
        lambda b: b[:-1] + bytes([b[-1] ^ 0x01]),
        lambda b: b"\x00\x09" + b[2:],
        lambda b: b"",
        lambda b: b + b"\x00",
    ],
    ids=["torn", "offset-bit-flip", "timestamp-bit-flip-only-crc-sees", "unknown-version", "empty", "trailing"],
)
def test_corrupt_newest_snapshot_falls_back_to_the_previous_one(tmp_path, damage):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(8, 0, 0, 0, txn=True))
    state.take_snapshot(1)
    populate(log)
    state.take_snapshot(log.end_offset)
    newest = tmp_path / f"{log.end_offset:020d}.snapshot"
    newest.write_bytes(damage(newest.read_bytes()))

    reloaded = reopen(tmp_path, log)
    assert log.replayed_from == [1]
    assert view(reloaded) == view(state)
    assert not newest.exists()
    assert reloaded.snapshot_offsets == [1]


def test_snapshot_offset_must_match_the_file_name(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0))
    state.take_snapshot(1)
    os.rename(tmp_path / f"{1:020d}.snapshot", tmp_path / f"{5:020d}.snapshot")
    log.append(data(1, 0, 1, 1, count=4))
    reloaded = reopen(tmp_path, log)
    assert log.replayed_from == [0]
    assert view(reloaded) == view(state)


def test_only_the_newest_snapshots_are_kept(tmp_path):
    state = ProducerStateManager(tmp_path, snapshots_to_keep=3)
    log = FakeLog(state)
    for i in range(5):
        log.append(data(1, 0, i, i))
        state.take_snapshot(log.end_offset)
    assert state.snapshot_offsets == [3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{o:020d}.snapshot" for o in (3, 4, 5)]


def test_snapshot_below_the_applied_state_is_refused(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0, count=3))
    with pytest.raises(ValueError):
        state.take_snapshot(2)


def test_leftover_temp_files_are_removed_and_ignored(tmp_path):
    (tmp_path / f"{9:020d}.snapshot.tmp").write_bytes(b"half written")
    state = ProducerStateManager(tmp_path)
    assert state.snapshot_offsets == []
    assert list(tmp_path.iterdir()) == []


def test_failed_snapshot_write_leaves_earlier_snapshots_intact(tmp_path, monkeypatch):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0))
    state.take_snapshot(1)
    before = (tmp_path / f"{1:020d}.snapshot").read_bytes()
    log.append(data(1, 0, 1, 1))

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        state.take_snapshot(2)
    monkeypatch.undo()
    assert (tmp_path / f"{1:020d}.snapshot").read_bytes() == before
    assert not (tmp_path / f"{2:020d}.snapshot").exists()


# -- truncation ------------------------------------------------------------------------------


def test_truncation_rolls_back_to_the_state_at_the_truncation_point(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0, count=2))
    log.append(data(2, 0, 0, 2, txn=True))
    state.take_snapshot(3)

    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = ProducerStateManager(reference_dir)
    reference_log = FakeLog(reference)
    for item in log.items:
        reference_log.append(item, origin="replication")
    log.append(data(1, 0, 2, 3))
    log.append(marker(2, 0, 4), origin="coordinator")  # commits producer 2's transaction
    state.take_snapshot(5)
    log.append(data(3, 0, 0, 5, txn=True))
    log.append(data(1, 1, 0, 6))
    state.take_snapshot(7)
    assert state.first_unstable_offset() == 5

    log.truncate(3)
    state.truncate_and_reload(0, 3, log.replay)
    assert state.snapshot_offsets == [3]
    assert sorted(p.name for p in tmp_path.glob("*.snapshot")) == [f"{3:020d}.snapshot"]
    assert view(state) == view(reference)
    assert state.first_unstable_offset() == 2  # the commit was cut off, the transaction is open again
    assert state.map_end_offset == 3
    # producer 1 continues from where the truncated log leaves it
    state.apply(state.validate([data(1, 0, 2, 3)], NOW))


def test_truncation_below_every_snapshot_replays_from_the_start(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0))
    log.append(data(2, 0, 0, 1))
    state.take_snapshot(2)
    log.truncate(1)
    state.truncate_and_reload(0, 1, log.replay)
    assert log.replayed_from == [0]
    assert [p.producer_id for p in state.active_producers()] == [1]
    assert state.snapshot_offsets == []


def test_reload_applies_the_log_start_offset(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0))
    state.take_snapshot(1)
    log.append(data(2, 0, 0, 1))
    state.take_snapshot(2)
    log.append(data(3, 0, 0, 2))
    reloaded = ProducerStateManager(tmp_path)
    reloaded.truncate_and_reload(2, log.end_offset, log.replay)
    assert reloaded.snapshot_offsets == [2]
    assert [p.producer_id for p in reloaded.active_producers()] == [3]


def test_replay_ignores_batches_outside_the_range(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    for i in range(4):
        log.append(data(1, 0, i, i))
        if i == 1:
            state.take_snapshot(2)
    reloaded = ProducerStateManager(tmp_path)
    reloaded.truncate_and_reload(0, 3, log.replay)  # the log's end is 3: the batch at 3 is not in it
    assert reloaded.entry(1).last_seq == 2


def test_plan_from_before_a_reload_is_refused(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    log.append(data(1, 0, 0, 0))
    plan = state.validate([data(1, 0, 1, 1)], NOW)
    state.truncate_and_reload(0, 1, log.replay)
    with pytest.raises(RuntimeError):
        state.apply(plan)


def test_log_start_offset_deletes_older_snapshots(tmp_path):
    state = ProducerStateManager(tmp_path)
    log = FakeLog(state)
    for i in range(3):
        log.append(data(1, 0, i, i))
        state.take_snapshot(i + 1)
    state.on_log_start_offset(2)
    assert state.snapshot_offsets == [2, 3]


def test_encode_decode_round_trip():
    entries = [
        ProducerEntry(5, 2, (BatchMetadata(0, 4, 10, 14, NOW), BatchMetadata(5, 5, 15, 15, NOW + 1)), NOW, 15, 3, 10),
        ProducerEntry(2**62, 0, (), -1, -1, -1, None),
    ]
    assert snapshot_file.decode(snapshot_file.encode(99, entries)) == (99, entries)


# -- snapshot + replay == full replay, for random histories -------------------------------------


def random_history(rng, log, state):
    """Idempotent and transactional traffic from four producers, epoch bumps, random snapshots."""
    model = {pid: {"epoch": 0, "seq": 0, "txn": False} for pid in range(1, 5)}
    for _ in range(80):
        pid = rng.choice(list(model))
        p = model[pid]
        action = rng.random()
        if p["txn"] and action < 0.3:
            bump = rng.random() < 0.3
            p["epoch"] += bump
            p["seq"] = 0 if bump else p["seq"]
            p["txn"] = False
            log.append(marker(pid, p["epoch"], log.end_offset, abort=rng.random() < 0.5), origin="coordinator")
        elif action < 0.4 and not p["txn"]:
            p["epoch"] += 1
            p["seq"] = 0
            log.append(data(pid, p["epoch"], 0, log.end_offset))
            p["seq"] = 1
        else:
            count = rng.randint(1, 4)
            txn = p["txn"] or rng.random() < 0.3
            log.append(data(pid, p["epoch"], p["seq"], log.end_offset, count=count, txn=txn))
            p["seq"] += count
            p["txn"] = txn
        if rng.random() < 0.15:
            state.take_snapshot(log.end_offset)


@pytest.mark.parametrize("seed", range(5))
def test_reload_at_any_point_equals_a_full_replay(tmp_path, seed):
    rng = random.Random(seed)
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    state = ProducerStateManager(live_dir, snapshots_to_keep=100)
    log = FakeLog(state)
    random_history(rng, log, state)
    assert len(state.snapshot_offsets) > 2
    boundaries = [_header(i).base_offset for i in log.items] + [log.end_offset]

    for cut in sorted(set(rng.sample(boundaries, 12)) | {log.end_offset}):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(live_dir, work)
        truncated = FakeLog(None)
        truncated.items = [i for i in log.items if _header(i).base_offset < cut]
        reloaded = ProducerStateManager(work)
        reloaded.truncate_and_reload(0, cut, truncated.replay)
        assert all(o <= cut for o in reloaded.snapshot_offsets)

        scratch = tmp_path / f"scratch{cut}"
        scratch.mkdir()
        reference = ProducerStateManager(scratch)
        reference.truncate_and_reload(0, cut, truncated.replay)
        assert view(reloaded) == view(reference), cut
        if cut == log.end_offset:
            assert view(reloaded) == view(state)
