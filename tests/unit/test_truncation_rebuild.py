"""A truncation rebuilds producer state from the last snapshot, which is taken only at roll and
clean shutdown: up to a segment of batches replayed. The follower's fetcher runs that rebuild
in steps with the event loop turning between them (issue 11: no long holds of the loop), and
the state it ends with is exactly what a rebuild in one piece gives (issue 13)."""

import asyncio

from ottla.config import BrokerConfig, TopicConfig
from ottla.log import Log
from ottla.log.loader import replay_batches
from ottla.producer_state.manager import RELOAD_STEP_BATCHES, ProducerStateManager
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch
from tests.loop_turns import seen_between_turns, with_turns
from tests.unit.test_replica_fetcher_retries import ANSWERED, LEADER, _leader_and_follower, _states

PRODUCERS = 50
TXN_PID = 999


def _batch(pid, seq, *, txn=False):
    return build_batch([Record(b"k", b"v", (), 1_000 + seq)], producer_id=pid, producer_epoch=0,
                       base_sequence=seq, is_transactional=txn)


def _filled_log(path):
    """3.5 steps of idempotent batches (50 producers in turn), a transaction opened in the middle
    and committed near the end; no roll, so no snapshot above offset 0. Returns the log, the
    transaction's first offset, the offset its commit marker got and each producer's offsets."""
    log = Log(path, TopicConfig(BrokerConfig(), {}))
    offsets = [[] for _ in range(PRODUCERS)]
    txn_first = None
    for i in range(RELOAD_STEP_BATCHES * 7 // 2):
        if i == RELOAD_STEP_BATCHES * 2:
            txn_first = log.append(_batch(TXN_PID, 0, txn=True), now_ms=0).base_offset
        pid = i % PRODUCERS
        offsets[pid].append(log.append(_batch(pid, len(offsets[pid])), now_ms=0).base_offset)
    marker = log.append(build_control_batch(TXN_PID, 0, 0, True, 5), now_ms=0, origin="coordinator").base_offset
    log.append(_batch(0, len(offsets[0])), now_ms=0)
    log.update_high_watermark(log.log_end_offset)
    return log, txn_first, marker, offsets


def _rebuilt_in_one_piece(log, tmp_path):
    (tmp_path / "reference").mkdir()
    state = ProducerStateManager(tmp_path / "reference")
    bases = [s.base_offset for s in log.segments]
    state.truncate_and_reload(0, log.log_end_offset,
                              lambda offset: replay_batches(log.segments, bases, log.log_end_offset, offset))
    return state


async def _rebuild(log):
    while log.rebuild_step():
        await asyncio.sleep(0)


def test_a_truncation_rebuilds_producer_state_with_the_loop_turning(tmp_path):
    log, txn_first, marker, offsets = _filled_log(tmp_path / "t-0")
    assert log.producer_state.snapshot_offsets == [] and log.last_stable_offset == log.log_end_offset
    log.truncate_to(marker)  # the commit is gone: the transaction is open again

    turns, _ = asyncio.run(with_turns(_rebuild(log)))

    assert turns >= 3  # one per step of RELOAD_STEP_BATCHES replayed batches
    assert log.last_stable_offset == txn_first
    rows = {p.producer_id: p for p in log.producer_state.active_producers()}
    assert rows[TXN_PID].current_txn_start_offset == txn_first
    assert {pid: rows[pid].last_sequence for pid in range(PRODUCERS)} == {
        pid: len(offsets[pid]) - 1 for pid in range(PRODUCERS)}
    assert log.producer_state.active_producers() == _rebuilt_in_one_piece(log, tmp_path).active_producers()
    # Producer 0's last batch below the cut, retried, is answered with its offsets; its next
    # one, which the truncation removed, goes in again at the log end.
    last = len(offsets[0]) - 1
    retry = log.append(_batch(0, last), now_ms=0)
    assert retry.duplicate and retry.base_offset == offsets[0][last]
    again = log.append(_batch(0, last + 1), now_ms=0)
    assert not again.duplicate and again.base_offset == marker


def test_anything_using_the_state_mid_rebuild_finishes_it_first(tmp_path):
    log, txn_first, marker, _ = _filled_log(tmp_path / "t-0")
    log.truncate_to(marker)
    assert log.rebuild_step()  # one step done, the state half-built

    assert log.last_stable_offset == txn_first
    assert not log.rebuild_step()  # nothing left: it was finished for the LSO
    assert log.producer_state.active_producers() == _rebuilt_in_one_piece(log, tmp_path).active_producers()


def test_a_second_truncation_mid_rebuild_starts_over(tmp_path):
    log, txn_first, marker, _ = _filled_log(tmp_path / "t-0")
    log.truncate_to(marker)
    assert log.rebuild_step()
    log.truncate_to(txn_first)  # the transaction's first batch goes too
    asyncio.run(_rebuild(log))
    assert log.last_stable_offset == log.log_end_offset == txn_first
    assert TXN_PID not in {p.producer_id for p in log.producer_state.active_producers()}


def test_the_replica_fetcher_rebuilds_in_steps_after_its_truncation(tmp_path):
    """Two real brokers in process (`_leader_and_follower`): the follower's log holds the
    leader's 2,500 batches of epoch 1 and 5 more the leader never had; on becoming follower in
    epoch 2 it truncates to 2,500 (OffsetsForLeaderEpoch) and replays the 2,500 with other
    tasks running between steps."""
    common, extra = RELOAD_STEP_BATCHES * 5 // 2, 5

    async def scenario():
        async with _leader_and_follower(tmp_path) as (leader, follower, manager):
            copied = follower.logs.get_log("t", 0)
            for i in range(common + extra):
                batch = _batch(i % PRODUCERS, i // PRODUCERS)
                if i < common:
                    leader.logs.get_log("t", 0).append(batch, now_ms=0, leader_epoch=1)
                copied.append(batch, now_ms=0, leader_epoch=1)
            leader.replicas.apply_partition_states(_states({0: 2}))
            manager.learn_endpoints({LEADER: (leader.host, leader.port)})
            follower.replicas.fetchers = manager

            def rebuilt_to():  # looked at without finishing a pending rebuild
                return copied._producers.created.map_end_offset

            async def truncated():
                follower.replicas.apply_partition_states(_states({0: 2}))
                async with asyncio.timeout(ANSWERED):
                    while copied.log_end_offset != common:
                        await asyncio.sleep(0.001)
                for _ in range(20):  # turns enough for the fetcher's three steps
                    await asyncio.sleep(0)

            seen, _ = await seen_between_turns(truncated(), rebuilt_to)
            # Other tasks ran after the first and the second step, with the state half-built.
            assert {m for m in seen if 0 < m < common} == {RELOAD_STEP_BATCHES, 2 * RELOAD_STEP_BATCHES}
            assert copied.producer_state.active_producers() == \
                _rebuilt_in_one_piece(copied, tmp_path).active_producers()

    asyncio.run(scenario())

