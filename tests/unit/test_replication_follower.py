"""The follower's truncation decision (KIP-101/KIP-279) and its fetch state machine, on real
logs with explicit time."""

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.log import Log
from ottla.replication.epochs import check_current_leader_epoch, diverging_epoch, epoch_end_offset
from ottla.replication.follower import FetchPhase, FollowerFetchState, Truncation, truncation_for
from ottla.replication.leader import become_leader
from tests.unit.test_log import batch, config


def log_with(path, epochs):
    """A log with one 1-record batch per entry of `epochs`, each stamped with it."""
    log = Log(path, config())
    for epoch in epochs:
        log.append(batch(1), now_ms=0, leader_epoch=epoch)
    return log


def ask(follower: FollowerFetchState, leader: Log, leader_epoch: int, now_ms=0):
    answer = epoch_end_offset(leader, leader_epoch, follower.latest_epoch())
    return follower.on_epoch_end_offset(ErrorCode.none, answer.leader_epoch, answer.end_offset, now_ms)


def test_the_follower_keeps_what_the_leader_has_of_its_epoch(tmp_path):
    follower = log_with(tmp_path / "f", [0, 0, 1, 1, 1])
    assert truncation_for(1, 5, follower) == Truncation(5, True)
    assert truncation_for(1, 3, follower) == Truncation(3, True)  # the leader's epoch 1 ended sooner
    assert truncation_for(1, 9, follower) == Truncation(5, True)  # never past its own end
    assert truncation_for(0, 1, follower) == Truncation(1, True)
    assert truncation_for(-1, -1, follower) is None  # the leader cannot answer: ask again later


def test_kip_279_iterates_when_the_leader_answers_an_epoch_the_follower_never_had(tmp_path):
    # follower: epochs 0 [0,4), 2 [4,7), 3 [7,10); leader: 0 [0,3), 1 [3,8), 4 [8,...)
    follower_log = log_with(tmp_path / "f", [0] * 4 + [2] * 3 + [3] * 3)
    leader = log_with(tmp_path / "l", [0] * 3 + [1] * 5 + [4] * 2)
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=4)
    assert state.phase is FetchPhase.TRUNCATING
    # asks for 3; the leader's largest epoch <= 3 is 1, ending at 8; the follower's epoch <= 1 is 0
    assert ask(state, leader, 4) == Truncation(4, False)
    assert state.phase is FetchPhase.TRUNCATING and state.latest_epoch() == 0
    assert ask(state, leader, 4) == Truncation(3, True)  # epoch 0 ended at 3 on the leader
    assert state.phase is FetchPhase.FETCHING and state.fetch_offset == 3
    records = leader.read(3, 1 << 20, max_offset=leader.log_end_offset).records
    state.on_fetch_response(ErrorCode.none, bytes(records), 10, 0, now_ms=0)
    ours = follower_log.read(0, 1 << 20, max_offset=10).records
    assert bytes(ours) == bytes(leader.read(0, 1 << 20, max_offset=10).records)
    assert follower_log.leader_epoch_cache.entries == leader.leader_epoch_cache.entries


def test_an_empty_follower_fetches_at_once(tmp_path):
    state = FollowerFetchState(Log(tmp_path / "f", config()), leader_id=1, leader_epoch=3)
    assert state.phase is FetchPhase.FETCHING and state.fetch_offset == 0


def test_fetch_response_sets_the_followers_high_watermark_and_log_start(tmp_path):
    leader = log_with(tmp_path / "l", [0] * 6)
    follower_log = Log(tmp_path / "f", config())
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=0)
    records = bytes(leader.read(0, 1 << 20, max_offset=4).records)
    state.on_fetch_response(ErrorCode.none, records, 6, 0, now_ms=0)
    assert (follower_log.log_end_offset, follower_log.high_watermark) == (4, 4)  # capped at its own end
    state.on_fetch_response(ErrorCode.none, b"", 3, 2, now_ms=0)
    assert (follower_log.high_watermark, follower_log.log_start_offset) == (3, 2)  # the leader's, as Kafka


def test_the_failpoint_hook_runs_between_the_append_and_a_higher_hw(tmp_path):
    """Seed 001's follower crash point: records appended, the HW the answer carries not yet
    taken; an answer that does not raise the HW passes it by."""
    leader = log_with(tmp_path / "l", [0] * 2)
    follower_log = Log(tmp_path / "f", config())
    seen = []
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=0, before_high_watermark_moves=lambda: seen.append(
        (follower_log.log_end_offset, follower_log.high_watermark)))
    state.on_fetch_response(ErrorCode.none, bytes(leader.read(0, 1 << 20, max_offset=2).records), 0, 0, now_ms=0)
    assert seen == [] and follower_log.log_end_offset == 2  # HW 0 in the answer that brought the records
    state.on_fetch_response(ErrorCode.none, b"", 2, 0, now_ms=0)
    assert seen == [(2, 0)] and follower_log.high_watermark == 2


def test_fenced_and_unknown_leader_epochs(tmp_path):
    follower_log = log_with(tmp_path / "f", [0])
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=2, backoff_ms=1_000)
    # UNKNOWN_LEADER_EPOCH: the leader has yet to apply its LeaderAndIsr; asked again after
    # 50 ms, then twice as late each time, up to replica.fetch.backoff.ms.
    waits = []
    for now in (100, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000):
        state.on_epoch_end_offset(ErrorCode.unknown_leader_epoch, -1, -1, now_ms=now)
        assert state.phase is FetchPhase.TRUNCATING
        waits.append(next(d for d in range(1, 2_000) if state.ready(now + d)))
    assert waits == [50, 100, 200, 400, 800, 1_000, 1_000]
    state.on_epoch_end_offset(ErrorCode.none, 0, 1, now_ms=7_000)
    assert state.phase is FetchPhase.FETCHING
    state.on_fetch_response(ErrorCode.unknown_leader_epoch, b"", -1, -1, now_ms=7_100)
    assert not state.ready(7_149) and state.ready(7_150)  # an answer in between started over
    state.on_fetch_response(ErrorCode.not_leader_or_follower, b"", -1, -1, now_ms=7_200)
    assert not state.ready(8_199) and state.ready(8_200)  # other errors: replica.fetch.backoff.ms
    state.on_fetch_response(ErrorCode.fenced_leader_epoch, b"", -1, -1, now_ms=8_200)
    assert state.phase is FetchPhase.FENCED and not state.ready(10**9)
    state.become_follower(leader_id=3, leader_epoch=5)  # the controller's next word
    assert state.phase is FetchPhase.TRUNCATING and state.ready(8_200) and state.current_leader_epoch == 5


def test_offset_out_of_range_ahead_of_the_leader_truncates_to_its_end(tmp_path):
    follower_log = log_with(tmp_path / "f", [0] * 5)
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=0)
    state.phase = FetchPhase.FETCHING
    state.on_fetch_response(ErrorCode.offset_out_of_range, b"", -1, -1, now_ms=0)
    assert state.phase is FetchPhase.RESETTING
    state.on_leader_offsets(ErrorCode.none, 0, 3, now_ms=0)
    assert state.phase is FetchPhase.FETCHING and follower_log.log_end_offset == 3


def test_offset_out_of_range_behind_the_leaders_start_restarts_the_log_there(tmp_path):
    follower_log = log_with(tmp_path / "f", [0] * 2)
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=0)
    state.phase = FetchPhase.FETCHING
    state.on_fetch_response(ErrorCode.offset_out_of_range, b"", -1, -1, now_ms=0)
    state.on_leader_offsets(ErrorCode.none, 40, 50, now_ms=0)
    assert (follower_log.log_start_offset, follower_log.log_end_offset, follower_log.high_watermark) == (40, 40, 40)
    assert follower_log.leader_epoch_cache.entries == []


@pytest.mark.parametrize("requested, current, expected", [
    (-1, 4, ErrorCode.none), (4, 4, ErrorCode.none),
    (3, 4, ErrorCode.fenced_leader_epoch), (5, 4, ErrorCode.unknown_leader_epoch),
])
def test_current_leader_epoch_check(requested, current, expected):
    assert check_current_leader_epoch(requested, current) is expected


def test_diverging_epoch_in_fetch(tmp_path):
    """KIP-595: a fetch naming its last fetched epoch learns where that epoch ends here when
    its data went further than the leader's (leader: 0 [0,3), 1 [3,8), 4 [8,10))."""
    leader = log_with(tmp_path / "l", [0] * 3 + [1] * 5 + [4] * 2)
    assert diverging_epoch(leader, 4, 1, 8) is None  # epoch 1 ended exactly there
    assert diverging_epoch(leader, 4, 4, 10) is None  # the current epoch, at the log end
    assert diverging_epoch(leader, 4, 1, 9) == (1, 8)  # the fetcher has epoch-1 data the leader lacks
    assert diverging_epoch(leader, 4, 2, 9) == (1, 8)  # an epoch the leader never had
    assert diverging_epoch(leader, 4, 4, 12) == (4, 10)  # ahead of the leader in its own epoch
    with pytest.raises(KafkaError) as info:
        diverging_epoch(leader, 4, 6, 10)  # an epoch newer than anything here
    assert info.value.code is ErrorCode.offset_out_of_range


def test_a_diverging_epoch_answer_truncates_the_follower(tmp_path):
    leader = log_with(tmp_path / "l", [0] * 3 + [1] * 5 + [4] * 2)
    follower_log = log_with(tmp_path / "f", [0] * 3 + [1] * 7)  # three epoch-1 records the leader lacks
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=4)
    state.phase = FetchPhase.FETCHING  # e.g. a fetcher that skips OffsetsForLeaderEpoch
    found = diverging_epoch(leader, 4, state.latest_epoch(), state.fetch_offset)
    assert state.on_diverging_epoch(found.leader_epoch, found.end_offset, now_ms=0) == Truncation(8, True)
    assert state.phase is FetchPhase.FETCHING and follower_log.log_end_offset == 8
    assert diverging_epoch(leader, 4, state.latest_epoch(), state.fetch_offset) is None


def test_a_former_leader_drops_the_epoch_it_never_wrote_in(tmp_path):
    """Back-to-back elections: B led epoch 3 without writing (its cache says epoch 3 starts at
    its log end), then A led epoch 4. B's epoch 3 must go when it truncates to where epoch 1
    ends on A, which is its own log end (Kafka truncates the epoch cache even when the log
    has nothing past the point, KAFKA-7415): else every Fetch names epoch 3 and gets the same
    diverging-epoch answer again, and B never fetches anything."""
    leader = log_with(tmp_path / "a", [0, 1])
    become_leader(leader, 4)
    follower_log = log_with(tmp_path / "b", [0, 1])
    become_leader(follower_log, 3)
    state = FollowerFetchState(follower_log, leader_id=1, leader_epoch=4)
    assert ask(state, leader, 4) == Truncation(2, True)
    assert state.phase is FetchPhase.FETCHING and state.latest_epoch() == 1
    assert diverging_epoch(leader, 4, state.latest_epoch(), state.fetch_offset) is None
    assert follower_log.leader_epoch_cache.entries == [(0, 0), (1, 1)]
