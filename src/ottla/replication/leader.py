"""The leader's side of replication as a pure state machine: follower progress, the ISR, the
high watermark and when acks=all may answer (Kafka's Partition/Replica logic, seed 001).

No sockets, no clock: every call carries `now_ms`. The replica manager's `Partition` owns one
`LeaderState` while it leads, feeds it local appends and follower fetches, writes the ISR
changes it proposes to ZooKeeper (conditionally) and reports back with `isr_committed` /
`isr_change_failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..errors import ErrorCode, KafkaError

__all__ = ["LeaderState", "FollowerProgress", "REPLICA_LAG_TIME_MAX_MS", "become_leader"]

REPLICA_LAG_TIME_MAX_MS = 30_000  # Kafka's replica.lag.time.max.ms default


def become_leader(log, leader_epoch: int) -> None:
    """What the log needs when this replica becomes leader of `leader_epoch`: the epoch starts
    at the current log end (Kafka assigns it before any append), so OffsetsForLeaderEpoch
    answers followers of older epochs with where their epoch ended even before new data."""
    log.start_leader_epoch(leader_epoch)


@dataclass(slots=True)
class FollowerProgress:
    """The leader's view of one follower (Kafka's Replica state)."""

    replica_id: int
    log_end_offset: int = -1  # unknown until its first fetch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_leo: int = -1

    def on_fetch(self, fetch_offset: int, leader_leo: int, now_ms: int) -> None:
        """Kafka's Replica.updateFetchState: a fetch at the leader's log end catches up now; a
        fetch reaching what the leader's end was at the previous fetch caught up back then."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_ms = now_ms

    def caught_up(self, leader_leo: int, now_ms: int, lag_time_max_ms: int) -> bool:
        return self.log_end_offset == leader_leo or now_ms - self.last_caught_up_ms <= lag_time_max_ms


@dataclass(slots=True)
class LeaderState:
    """One partition led here: replicas, committed ISR, a pending ISR change, and the HW.

    The HW is the smallest log end offset among the leader and every ISR member, counting a
    pending change's additions too (Kafka's "maximal ISR"), and never moves backwards. It is
    more conservative than Kafka 3's, which also skips ISR members already past the lag time:
    an acknowledged record is then on every replica that may still be elected.
    """

    local_id: int
    replicas: tuple[int, ...]
    isr: frozenset[int]
    leader_epoch: int
    high_watermark: int
    log_end_offset: int
    now_ms: int
    lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS
    min_insync_replicas: int = 1
    pending_isr: frozenset[int] | None = None
    epoch_start_offset: int = field(init=False)
    followers: dict[int, FollowerProgress] = field(init=False)

    def __post_init__(self) -> None:
        # Only replicas can be in sync: a reassignment's last LeaderAndIsr may still list a
        # replica it has just removed from the assignment (the controller shrinks it out next).
        self.isr = frozenset(r for r in self.isr if r in self.replicas or r == self.local_id)
        if self.local_id not in self.isr:
            raise ValueError(f"leader {self.local_id} must be in its ISR {sorted(self.isr)}")
        self.epoch_start_offset = self.log_end_offset
        # Kafka's makeLeader: ISR members count as caught up at the leadership start, so a
        # slow first fetch does not shrink the ISR at once; others have never caught up.
        self.followers = {
            r: FollowerProgress(r, last_caught_up_ms=self.now_ms if r in self.isr else 0)
            for r in self.replicas if r != self.local_id
        }
        self._advance_high_watermark()

    # -- inputs --------------------------------------------------------------------------

    def on_local_append(self, log_end_offset: int) -> bool:
        """The leader's log grew (produce or coordinator write). Returns whether the HW moved
        (on a one-member ISR it follows the log end at once)."""
        self.log_end_offset = log_end_offset
        return self._advance_high_watermark()

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from `fetch_offset` (so it has everything below). Returns whether
        the HW moved. Unknown replica ids are NOT_LEADER_OR_FOLLOWER, as Kafka answers."""
        follower = self.followers.get(replica_id)
        if follower is None:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"replica {replica_id} is not a replica of this partition")
        follower.on_fetch(fetch_offset, self.log_end_offset, now_ms)
        return self._advance_high_watermark()

    # -- ISR changes ---------------------------------------------------------------------

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | self.pending_isr if self.pending_isr is not None else self.isr

    def out_of_sync_replicas(self, now_ms: int) -> frozenset[int]:
        """ISR followers that have not caught up within replica.lag.time.max.ms."""
        return frozenset(
            r for r in self.isr if r != self.local_id
            and not self.followers[r].caught_up(self.log_end_offset, now_ms, self.lag_time_max_ms)
        )

    def propose_isr_shrink(self, now_ms: int) -> frozenset[int] | None:
        """The ISR to write when some member fell behind, else None (also while a change is in
        flight: Kafka sends one AlterPartition at a time)."""
        if self.pending_isr is not None:
            return None
        lagging = self.out_of_sync_replicas(now_ms)
        if not lagging:
            return None
        self.pending_isr = self.isr - lagging
        return self.pending_isr

    def propose_isr_expand(self) -> frozenset[int] | None:
        """The ISR to write when a follower outside it reached the HW and the start of the
        current epoch (Kafka's isFollowerInSync), else None."""
        if self.pending_isr is not None:
            return None
        joining = frozenset(
            r for r, f in self.followers.items()
            if r not in self.isr and f.log_end_offset >= self.high_watermark
            and f.log_end_offset >= self.epoch_start_offset
        )
        if not joining:
            return None
        self.pending_isr = self.isr | joining
        return self.pending_isr

    def isr_committed(self, isr: Iterable[int]) -> bool:
        """ZooKeeper (or the controller) accepted an ISR; returns whether the HW moved."""
        self.isr = frozenset(isr)
        self.pending_isr = None
        return self._advance_high_watermark()

    def isr_change_failed(self) -> None:
        """The conditional write was refused (stale version): keep the committed ISR and let
        the next proposal start over from fresh state."""
        self.pending_isr = None

    # -- produce -------------------------------------------------------------------------

    def check_enough_replicas(self, acks: int) -> None:
        """Before an acks=all append: NOT_ENOUGH_REPLICAS when the ISR is below
        min.insync.replicas (acks 0 and 1 append anyway, as in Kafka)."""
        if acks == -1 and len(self.isr) < self.min_insync_replicas:
            raise KafkaError(ErrorCode.not_enough_replicas,
                             f"ISR {sorted(self.isr)} is smaller than min.insync.replicas={self.min_insync_replicas}")

    def acks_all_result(self, required_offset: int) -> ErrorCode | None:
        """Whether an acks=all produce whose last offset is `required_offset - 1` may answer:
        None while the HW is below it; then NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when the
        ISR shrank below min.insync.replicas meanwhile (the data is written but the guarantee
        is not met: Kafka's checkEnoughReplicasReachOffset)."""
        if self.high_watermark < required_offset:
            return None
        if len(self.isr) < self.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    # -- the high watermark --------------------------------------------------------------

    def _advance_high_watermark(self) -> bool:
        candidate = self.log_end_offset
        for r in self.maximal_isr:
            if r != self.local_id:
                candidate = min(candidate, self.followers[r].log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False
