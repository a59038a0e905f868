"""The leader's replication policy with explicit time: follower progress, ISR shrink and
expand after replica.lag.time.max.ms, the high watermark over the ISR, acks=all and
min.insync.replicas."""

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.replication.leader import REPLICA_LAG_TIME_MAX_MS, LeaderState

LAG = REPLICA_LAG_TIME_MAX_MS


def leader(isr=(1, 2, 3), *, leo=0, hw=0, min_isr=1, now=0):
    return LeaderState(local_id=1, replicas=(1, 2, 3), isr=frozenset(isr), leader_epoch=4,
                       high_watermark=hw, log_end_offset=leo, now_ms=now, min_insync_replicas=min_isr)


def test_high_watermark_is_the_smallest_log_end_in_the_isr():
    state = leader()
    assert not state.on_local_append(10)
    assert state.high_watermark == 0  # followers have not fetched yet
    assert not state.on_follower_fetch(2, 10, now_ms=1)
    assert state.high_watermark == 0
    assert state.on_follower_fetch(3, 7, now_ms=1)
    assert state.high_watermark == 7
    assert state.on_follower_fetch(3, 10, now_ms=2)
    assert state.high_watermark == 10


def test_high_watermark_never_moves_backwards():
    state = leader(isr=(1,), leo=5, hw=5)
    state.isr_committed({1, 2})  # a member far behind joins (e.g. on a leader with a stale view)
    state.on_follower_fetch(2, 1, now_ms=0)
    assert state.high_watermark == 5


def test_a_single_member_isr_follows_the_log_end():
    state = leader(isr=(1,))
    assert state.on_local_append(3)
    assert state.high_watermark == 3


def test_a_follower_that_stops_fetching_leaves_the_isr_after_the_lag_time():
    state = leader()
    state.on_local_append(5)
    state.on_follower_fetch(2, 5, now_ms=100)
    state.on_follower_fetch(3, 5, now_ms=100)
    state.on_local_append(9)
    state.on_follower_fetch(2, 9, now_ms=200)
    assert state.propose_isr_shrink(now_ms=100 + LAG) is None  # 3 caught up at 100, limit inclusive
    assert state.propose_isr_shrink(now_ms=101 + LAG) == {1, 2}
    assert state.maximal_isr == {1, 2, 3}  # until ZooKeeper takes it, 3 still holds the HW
    assert state.high_watermark == 5
    assert state.isr_committed({1, 2})
    assert state.high_watermark == 9


def test_a_follower_that_keeps_fetching_behind_a_busy_leader_stays():
    """Kafka's rule: reaching the leader's end as of the previous fetch counts as caught up."""
    state = leader(isr=(1, 2))
    for step in range(1, 200):
        state.on_local_append(step * 10)
        state.on_follower_fetch(2, (step - 1) * 10, now_ms=step * 1000)
    assert state.propose_isr_shrink(now_ms=200 * 1000) is None


def test_a_follower_that_falls_further_behind_leaves():
    state = leader(isr=(1, 2))
    for step in range(1, 40):
        state.on_local_append(step * 10)
        state.on_follower_fetch(2, step, now_ms=step * 1000)  # one record per fetch: never catches up
    assert state.propose_isr_shrink(now_ms=40 * 1000) == {1}


def test_a_follower_rejoins_when_it_reaches_the_high_watermark_of_this_epoch():
    state = leader(isr=(1,), leo=20, hw=20)
    state.on_follower_fetch(2, 15, now_ms=0)
    assert state.propose_isr_expand() is None
    state.on_follower_fetch(2, 20, now_ms=1)
    assert state.propose_isr_expand() == {1, 2}
    assert state.propose_isr_expand() is None  # one change in flight at a time
    state.isr_change_failed()  # a stale znode version: proposed again from fresh state
    assert state.propose_isr_expand() == {1, 2}
    state.isr_committed({1, 2})
    assert state.isr == {1, 2} and state.pending_isr is None


def test_acks_all_waits_for_the_isr_and_checks_min_insync_replicas():
    state = leader(isr=(1, 2, 3), min_isr=2)
    state.check_enough_replicas(-1)
    state.on_local_append(4)
    assert state.acks_all_result(4) is None
    state.on_follower_fetch(2, 4, now_ms=0)
    assert state.acks_all_result(4) is None  # 3 is in the ISR and does not have it yet
    state.on_follower_fetch(3, 4, now_ms=0)
    assert state.acks_all_result(4) is ErrorCode.none


def test_not_enough_replicas_before_and_after_the_append():
    state = leader(isr=(1, 2), min_isr=2)
    state.on_local_append(3)  # appended while the ISR had two members
    state.propose_isr_shrink(now_ms=LAG + 1)
    state.isr_committed({1})  # the follower never fetched it
    assert state.acks_all_result(3) is ErrorCode.not_enough_replicas_after_append
    with pytest.raises(KafkaError) as info:
        state.check_enough_replicas(-1)
    assert info.value.code is ErrorCode.not_enough_replicas
    state.check_enough_replicas(1)  # acks=1 and acks=0 do not care
    state.check_enough_replicas(0)


def test_fetches_from_replicas_of_other_partitions_are_refused():
    state = leader()
    with pytest.raises(KafkaError) as info:
        state.on_follower_fetch(9, 0, now_ms=0)
    assert info.value.code is ErrorCode.not_leader_or_follower


def test_an_isr_member_that_is_no_longer_a_replica_is_not_in_sync():
    """The LeaderAndIsr that completes a reassignment may still name the replica it removed;
    the leader must neither wait for it nor fail on it."""
    state = LeaderState(2, (2,), frozenset({2, 1}), leader_epoch=3, high_watermark=10, log_end_offset=15, now_ms=0)
    assert state.isr == {2}
    assert state.high_watermark == 15
