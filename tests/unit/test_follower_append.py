"""Follower appends (origin "replication"): batches copied from a leader's log, fetch by fetch,
keep their offsets and bytes and rebuild the same producer state, transaction index and last
stable offset as on the leader, so a follower promoted to leader dedupes retries from before
the failover and holds read_committed readers at the same place."""

import dataclasses

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.log import Log
from ottla.records.batch import parse_batches
from ottla.records.control import build_control_batch
from tests.unit.test_log import batch, config

SEGMENT = 700


def write_leader(log: Log) -> dict:
    """Idempotent, transactional (aborted, committed, still open) and plain data, with markers,
    over several segments and two leader epochs. Returns the last idempotent batch sent."""
    epoch = 0
    seqs = {}

    def produce(pid, *, n=2, txn=False, producer_epoch=0):
        seq = seqs.get((pid, producer_epoch), 0)
        seqs[(pid, producer_epoch)] = seq + n
        records = batch(n, producer_id=pid, epoch=producer_epoch, seq=seq, txn=txn)
        log.append(records, now_ms=10, leader_epoch=epoch)
        return records

    def marker(pid, commit, producer_epoch=0):
        log.append(build_control_batch(pid, producer_epoch, 3, commit, 10), now_ms=10, origin="coordinator",
                   leader_epoch=epoch)

    for _ in range(3):
        produce(7)
    produce(1, txn=True)
    produce(2, txn=True)
    log.append(batch(3), now_ms=10, leader_epoch=epoch)
    produce(1, txn=True)
    marker(1, commit=False)
    epoch = 2  # a leader change in the middle of producer 2's transaction
    produce(2, txn=True)
    marker(2, commit=True)
    produce(7, producer_epoch=1)
    produce(4, txn=True)  # stays open
    last = produce(7, producer_epoch=1)
    log.update_high_watermark(log.log_end_offset)  # every follower has it all, in the end
    return {"last": last}


def replicate(leader: Log, follower: Log, max_bytes: int) -> int:
    """Fetch-sized copies until the follower has everything; returns how many fetches."""
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.read(follower.log_end_offset, max_bytes, max_offset=leader.log_end_offset)
        follower.append(bytes(data.records), now_ms=99, origin="replication")
        follower.update_high_watermark(leader.high_watermark)
        fetches += 1
    return fetches


def everything(log: Log) -> bytes:
    return bytes(log.read(0, 1 << 30, max_offset=log.log_end_offset).records)


def producer_view(log: Log):
    """Everything the producer state knows, but the last-write time: a leader stamps its own
    clock, a follower (like recovery) the batch's max timestamp."""
    state = log.producer_state
    entries = {pid: dataclasses.replace(state.entry(pid), last_timestamp=0) for pid in (1, 2, 4, 7)}
    return entries, state.first_unstable_offset()


@pytest.fixture(params=[1, 300, 1 << 20], ids=["batch-per-fetch", "small-fetches", "one-fetch"])
def pair(tmp_path, request):
    leader = Log(tmp_path / "leader" / "t-0", config(segment_bytes=SEGMENT))
    sent = write_leader(leader)
    follower = Log(tmp_path / "follower" / "t-0", config(segment_bytes=SEGMENT))
    replicate(leader, follower, request.param)
    return leader, follower, sent


def test_batches_offsets_and_epochs_are_the_leaders(pair):
    leader, follower, _ = pair
    assert everything(follower) == everything(leader)
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [(0, 0), (2, 16)]


def test_producer_state_and_last_stable_offset_are_the_leaders(pair):
    leader, follower, _ = pair
    assert producer_view(follower) == producer_view(leader)
    assert [p.last_timestamp for p in follower.producer_state.active_producers()] == [10, 10, 1_001, 1_001]
    assert follower.last_stable_offset == leader.last_stable_offset == 21  # producer 4's open transaction


def test_aborted_transaction_index_is_the_leaders(pair):
    leader, follower, _ = pair
    for start in range(leader.log_end_offset):
        ours = follower.read(start, 1 << 30, max_offset=follower.log_end_offset, with_aborted=True)
        theirs = leader.read(start, 1 << 30, max_offset=leader.log_end_offset, with_aborted=True)
        assert ours.aborted_transactions == theirs.aborted_transactions, start
    assert [(t.producer_id, t.first_offset, t.last_offset) for s in follower.segments
            for t in s.txn_index.entries] == [(1, 6, 15)]


def test_follower_rolls_and_snapshots_producer_state(pair):
    _, follower, _ = pair
    assert len(follower.segments) > 1
    snapshots = follower.producer_state.snapshot_offsets
    rolls = [s.base_offset for s in follower.segments[1:]]
    assert snapshots and snapshots == rolls[-len(snapshots):]  # one at each recent roll
    assert all((follower.directory / f"{offset:020d}.snapshot").exists() for offset in snapshots)


def test_promoted_follower_dedupes_a_retry_and_keeps_the_open_transaction(pair):
    leader, follower, sent = pair
    original = leader.log_end_offset - 2
    retry = follower.append(sent["last"], now_ms=500, leader_epoch=3)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (original, original + 1)
    with pytest.raises(KafkaError) as info:  # the next batch must continue the sequence
        follower.append(batch(2, producer_id=7, epoch=1, seq=9), now_ms=500, leader_epoch=3)
    assert info.value.code is ErrorCode.out_of_order_sequence_number
    follower.append(build_control_batch(4, 0, 3, True, 500), now_ms=500, origin="coordinator", leader_epoch=3)
    follower.update_high_watermark(follower.log_end_offset)  # a leader alone in its ISR
    assert follower.last_stable_offset == follower.high_watermark == follower.log_end_offset


def test_crash_recovery_of_a_follower_rebuilds_the_same_state(pair, tmp_path):
    leader, follower, _ = pair
    expected = producer_view(leader)
    again = Log(follower.directory, config(segment_bytes=SEGMENT), recovery_point=0)
    assert producer_view(again) == expected
    assert everything(again) == everything(leader)
    assert again.leader_epoch_cache.entries == leader.leader_epoch_cache.entries


def test_a_replicated_batch_must_continue_the_log(tmp_path):
    leader = Log(tmp_path / "l" / "t-0", config())
    leader.append(batch(2), now_ms=0)
    leader.append(batch(2), now_ms=0)
    follower = Log(tmp_path / "f" / "t-0", config())
    data = bytes(leader.read(0, 1 << 30, max_offset=4).records)
    follower.append(data, now_ms=0, origin="replication")
    first = parse_batches(data)[0]
    with pytest.raises(KafkaError) as info:
        follower.append(data[first.position:first.position + first.size], now_ms=0, origin="replication")
    assert info.value.code is ErrorCode.invalid_record
    assert follower.log_end_offset == 4
