"""Seed 001's two failure schedules of high-watermark truncation, replayed step by step on two
real logs on disk with explicit crashes and restarts.

Under each schedule the same steps run twice: with leader epochs (the follower truncates to
its leader's OffsetsForLeaderEpoch answer) nothing acknowledged is lost and the replicas do
not diverge; with the rule from before Kafka 0.11 (a restarted replica truncates to its own,
possibly stale, high watermark) the first schedule loses an acknowledged record and the
second leaves the replicas with different records at the same offset.
"""

from __future__ import annotations

import pytest

from ottla.errors import ErrorCode
from ottla.records.records import Record, build_batch, iter_batches
from tests.replicas import Replica, batches, fetch, serve_fetch, truncate

A, B = 1, 2
REPLICAS = (A, B)


def record(value: bytes) -> bytes:
    return build_batch([Record(b"k", value, (), 1_000)])


def values(replica: Replica) -> list[bytes]:
    return [r.value for b in batches(replica) for _, rs in iter_batches(b) for r in rs]


class HighWatermarkRule:
    """Replication before KIP-101: a replica truncates to its own HW when it restarts or
    becomes follower, and fetching past the leader's end truncates to the leader's end."""

    @staticmethod
    def restart(replica: Replica) -> None:
        replica.start()
        replica.log.truncate_to(replica.log.high_watermark)

    @staticmethod
    def become_follower(replica: Replica, leader: Replica, epoch: int) -> None:
        replica.become_follower(leader.broker_id, epoch)
        replica.log.truncate_to(replica.log.high_watermark)

    @staticmethod
    def catch_up(replica: Replica, leader: Replica) -> None:
        error, records, hw, start = serve_fetch(leader, replica.broker_id, replica.log.log_end_offset)
        if error is ErrorCode.offset_out_of_range:
            replica.log.truncate_to(leader.log.log_end_offset)
            error, records, hw, start = serve_fetch(leader, replica.broker_id, replica.log.log_end_offset)
        replica.fetcher.phase = replica.fetcher.phase.FETCHING
        replica.fetcher.on_fetch_response(error, records, hw, start, 0)


class LeaderEpochRule:
    """Kafka since 0.11 (KIP-101, KIP-279): no truncation at restart; a new follower truncates
    where its leader says its latest epoch ended."""

    @staticmethod
    def restart(replica: Replica) -> None:
        replica.start()

    @staticmethod
    def become_follower(replica: Replica, leader: Replica, epoch: int) -> None:
        replica.become_follower(leader.broker_id, epoch)
        truncate(replica, leader)

    @staticmethod
    def catch_up(replica: Replica, leader: Replica) -> None:
        fetch(replica, leader)


RULES = {"leader-epochs": LeaderEpochRule, "high-watermark": HighWatermarkRule}


def start_pair(tmp_path):
    a, b = Replica(tmp_path, A), Replica(tmp_path, B)
    a.become_leader(0, REPLICAS, {A, B})
    b.become_follower(A, 0)
    return a, b


@pytest.mark.parametrize("rule_name", RULES)
def test_schedule_1_acknowledged_record_survives_follower_restart_then_leader_crash(tmp_path, rule_name):
    """Seed 001, data loss: B has both records but learns HW 2 one fetch too late; B restarts,
    then A dies before B fetches again, and B leads."""
    rule = RULES[rule_name]
    a, b = start_pair(tmp_path)
    first = a.produce(record(b"m0"))
    fetch(b, a)  # B gets m0
    fetch(b, a)  # A's HW -> 1, B learns it
    assert a.acknowledged(first) and b.log.high_watermark == 1
    second = a.produce(record(b"m1"))
    fetch(b, a)  # B gets m1, still with HW 1
    fetch(b, a, deliver=False)  # A's HW -> 2: m1 acknowledged; B dies before reading the answer
    assert a.acknowledged(second)
    a.checkpoint_high_watermark()
    b.checkpoint_high_watermark()
    b.crash()

    rule.restart(b)
    a.crash()  # before B could fetch from A again
    b.become_leader(1, REPLICAS, {B})  # the controller elects B, the ISR's only survivor
    rule.restart(a)
    rule.become_follower(a, b, 1)
    rule.catch_up(a, b)

    if rule is LeaderEpochRule:
        assert values(b) == values(a) == [b"m0", b"m1"]
        b.produce(record(b"m2"))
        fetch(a, b)
        assert batches(a) == batches(b)
        assert a.log.leader_epoch_cache.entries == b.log.leader_epoch_cache.entries == [(0, 0), (1, 2)]
    else:  # the acknowledged m1 is gone from both replicas
        assert values(b) == values(a) == [b"m0"]


@pytest.mark.parametrize("rule_name", RULES)
def test_schedule_2_replicas_do_not_diverge_after_both_crash(tmp_path, rule_name):
    """Seed 001, divergence: A has m0 m1 with HW 2, B has only m0 on disk (its copy of m1 was
    not flushed when both machines lost power); B comes back first, leads, and takes m2 at
    offset 1; then A comes back."""
    rule = RULES[rule_name]
    a, b = start_pair(tmp_path)
    a.produce(record(b"m0"))
    fetch(b, a)
    fetch(b, a)
    b.flush()
    a.produce(record(b"m1"))
    fetch(b, a)  # B has m1 in its page cache only
    fetch(b, a, deliver=False)  # A's HW -> 2
    a.flush()
    a.checkpoint_high_watermark()
    b.checkpoint_high_watermark()
    a.power_loss()
    b.power_loss()

    rule.restart(b)
    assert b.log.log_end_offset == 1
    b.become_leader(1, REPLICAS, {B})
    third = b.produce(record(b"m2"))
    assert b.acknowledged(third)
    rule.restart(a)
    assert a.log.log_end_offset == 2 and a.log.high_watermark == 2
    rule.become_follower(a, b, 1)
    rule.catch_up(a, b)

    assert a.log.log_end_offset == b.log.log_end_offset == 2
    if rule is LeaderEpochRule:
        assert values(a) == values(b) == [b"m0", b"m2"]
        assert batches(a) == batches(b)
    else:  # same offsets, different records at offset 1, and nothing will ever repair it
        assert values(b) == [b"m0", b"m2"] and values(a) == [b"m0", b"m1"]
