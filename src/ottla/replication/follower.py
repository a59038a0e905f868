"""The follower's side of replication: where to truncate on becoming follower, and a fetch
state machine per partition (Kafka's AbstractFetcherThread / PartitionFetchState).

Truncation follows KIP-101 and KIP-279: the follower asks its leader (OffsetsForLeaderEpoch)
for the end of the follower's latest epoch and truncates to the smaller of that and its own
end of the same epoch, asking again with an older epoch when the leader answers with one the
follower does not have. It never truncates to its own high watermark, which may be stale: the
two schedules of seed 001 lose or diverge acknowledged data exactly that way.

No sockets and no clock: the fetcher that owns a `FollowerFetchState` sends the requests it
asks for and hands the answers back with `now_ms`. The log is the partition's
`ottla.log.Log`; only the local log is touched.
"""

from __future__ import annotations

import enum
from typing import Callable, NamedTuple

from ..errors import ErrorCode
from ..log.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

__all__ = ["Truncation", "truncation_for", "FetchPhase", "FollowerFetchState", "REPLICA_FETCH_BACKOFF_MS"]

REPLICA_FETCH_BACKOFF_MS = 1_000  # Kafka's replica.fetch.backoff.ms default
# UNKNOWN_LEADER_EPOCH: the leader has not yet applied the LeaderAndIsr that names this epoch
# (the controller sends it to every replica at once); the first retry comes this soon, then
# twice as late each time, up to replica.fetch.backoff.ms.
UNKNOWN_EPOCH_FIRST_RETRY_MS = 50


class Truncation(NamedTuple):
    """Truncate the log to `offset`; `completed` False: ask the leader again (with the
    follower's latest epoch after this truncation)."""

    offset: int
    completed: bool


def truncation_for(leader_epoch: int, leader_end_offset: int, log) -> Truncation | None:
    """Kafka's getOffsetTruncationState for the leader's answer `(leader_epoch,
    leader_end_offset)` to the follower's latest epoch. None when the leader could not answer
    (UNDEFINED end offset: it does not know that epoch yet, e.g. it is behind on its own
    leadership): the follower asks again later rather than guess from its own HW."""
    own_end = log.log_end_offset
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        return None
    if leader_epoch == UNDEFINED_EPOCH:
        return Truncation(min(leader_end_offset, own_end), True)
    follower_epoch, follower_end = log.end_offset_for_epoch(leader_epoch)
    if follower_end == UNDEFINED_EPOCH_OFFSET:
        # The follower has no epoch at or below the leader's: everything it has came later.
        return Truncation(min(leader_end_offset, own_end), True)
    if follower_epoch != leader_epoch:
        # The follower never saw the leader's epoch: cut to where its own older epoch ends
        # and ask again with that one.
        return Truncation(min(follower_end, own_end), False)
    return Truncation(min(follower_end, leader_end_offset, own_end), True)


class FetchPhase(enum.Enum):
    TRUNCATING = "truncating"  # waiting for OffsetsForLeaderEpoch
    FETCHING = "fetching"
    RESETTING = "resetting"  # OFFSET_OUT_OF_RANGE: waiting for the leader's log start and end
    FENCED = "fenced"  # our leader epoch is stale: wait for the controller's next LeaderAndIsr


class FollowerFetchState:
    """One partition this broker follows. The fetcher asks what to send:

    - `TRUNCATING`: OffsetsForLeaderEpoch for `latest_epoch()` with `current_leader_epoch`,
      answer through `on_epoch_end_offset`;
    - `FETCHING`: Fetch from `fetch_offset` with `current_leader_epoch` (and `latest_epoch()`
      as last_fetched_epoch), answer through `on_fetch_response`, or `on_diverging_epoch`
      when the answer names one;
    - `RESETTING`: ListOffsets earliest and latest, answer through `on_leader_offsets`;
    - `FENCED`: nothing until `become_follower` with a newer epoch.

    `ready(now_ms)` says whether a request may go now (after an error it backs off
    replica.fetch.backoff.ms). `before_high_watermark_moves`, if given, runs after a Fetch
    answer's records are appended and before the HW it carries is taken, when that HW is
    higher: seed 001's follower that crashes right there (a failpoint).
    """

    def __init__(self, log, leader_id: int, leader_epoch: int, *, backoff_ms: int = REPLICA_FETCH_BACKOFF_MS,
                 before_high_watermark_moves: Callable[[], None] | None = None):
        self.log = log
        self.backoff_ms = backoff_ms
        self.before_high_watermark_moves = before_high_watermark_moves
        self.delayed_until_ms = 0
        self.become_follower(leader_id, leader_epoch)

    def become_follower(self, leader_id: int, leader_epoch: int) -> None:
        """LeaderAndIsr made this replica a follower of `leader_id` in `leader_epoch`: start by
        finding the point where this log and the leader's agree."""
        self.leader_id = leader_id
        self.current_leader_epoch = leader_epoch
        self.phase = FetchPhase.TRUNCATING
        self.delayed_until_ms = 0
        self._unknown_epoch_answers = 0
        self._fenced_waits = 0
        if self.latest_epoch() is None:
            self.phase = FetchPhase.FETCHING  # an empty log has nothing to truncate

    @property
    def fetch_offset(self) -> int:
        return self.log.log_end_offset

    def latest_epoch(self) -> int | None:
        return self.log.leader_epoch_cache.latest_epoch

    def ready(self, now_ms: int) -> bool:
        return self.phase is not FetchPhase.FENCED and now_ms >= self.delayed_until_ms

    def next_request_due_ms(self, now_ms: int) -> int:
        """When this partition wants its next request (0: now), for a fetcher deciding how long
        a fetch of its other partitions may long-poll. Fenced, it waits for the LeaderAndIsr
        of its leader's new epoch, which the controller sent with the leader's and which
        usually follows the fenced answer within milliseconds: expected after
        UNKNOWN_EPOCH_FIRST_RETRY_MS, then twice as late each time it is not there, up to
        replica.fetch.backoff.ms."""
        if self.phase is FetchPhase.FENCED and self.delayed_until_ms <= now_ms:
            self.delayed_until_ms = now_ms + min(self.backoff_ms,
                                                 UNKNOWN_EPOCH_FIRST_RETRY_MS << min(self._fenced_waits, 16))
            self._fenced_waits += 1
        return self.delayed_until_ms

    def _back_off(self, now_ms: int) -> None:
        self.delayed_until_ms = now_ms + self.backoff_ms

    def _on_epoch_error(self, error: ErrorCode, now_ms: int) -> bool:
        """Errors every request shares; returns True when one was handled."""
        if error is ErrorCode.none:
            self._unknown_epoch_answers = 0
            return False
        if error is ErrorCode.fenced_leader_epoch:
            self.phase = FetchPhase.FENCED  # the leader moved on: the controller will tell us
        elif error is ErrorCode.unknown_leader_epoch:
            # The leader is behind the controller by one request, usually milliseconds: waiting
            # the whole backoff stalled acks=all on a partition just handed over by a
            # controlled shutdown for a second (benchmarks/failover.py).
            delay = min(self.backoff_ms, UNKNOWN_EPOCH_FIRST_RETRY_MS << min(self._unknown_epoch_answers, 16))
            self._unknown_epoch_answers += 1
            self.delayed_until_ms = now_ms + delay
        else:  # NOT_LEADER_OR_FOLLOWER, ...
            self._back_off(now_ms)
        return True

    def on_epoch_end_offset(self, error: ErrorCode, leader_epoch: int, end_offset: int, now_ms: int) -> Truncation | None:
        """The leader's OffsetsForLeaderEpoch answer: truncate the log as decided and go on
        fetching, or stay truncating to ask again. Returns the truncation done, if any."""
        if self.phase is not FetchPhase.TRUNCATING or self._on_epoch_error(error, now_ms):
            return None
        decision = truncation_for(leader_epoch, end_offset, self.log)
        if decision is None:
            self._back_off(now_ms)
            return None
        self.log.truncate_to(decision.offset)
        if decision.completed or self.latest_epoch() is None:
            self.phase = FetchPhase.FETCHING
        return decision

    def on_fetch_response(self, error: ErrorCode, records: bytes, high_watermark: int, log_start_offset: int,
                          now_ms: int) -> None:
        """Append what the leader sent at the fetch offset; then the follower's HW is the
        leader's, capped at its own log end, and its log start follows the leader's."""
        if self.phase is not FetchPhase.FETCHING:
            return
        if error is ErrorCode.offset_out_of_range:
            self.phase = FetchPhase.RESETTING
            return
        if self._on_epoch_error(error, now_ms):
            return
        log = self.log
        if records:
            log.append(records, now_ms=now_ms, origin="replication")
        if self.before_high_watermark_moves is not None and min(high_watermark, log.log_end_offset) > log.high_watermark:
            self.before_high_watermark_moves()
        log.update_high_watermark(high_watermark)
        if log_start_offset > log.log_start_offset and log_start_offset <= log.high_watermark:
            log.delete_records_before(log_start_offset)

    def on_diverging_epoch(self, leader_epoch: int, end_offset: int, now_ms: int) -> Truncation | None:
        """A Fetch v12+ answer with a diverging epoch (the fetch sent `latest_epoch()` as
        last_fetched_epoch, KIP-595): truncate as for an OffsetsForLeaderEpoch answer; when the
        leader named an epoch this log never had, finish through OffsetsForLeaderEpoch."""
        if self.phase is not FetchPhase.FETCHING:
            return None
        self.phase = FetchPhase.TRUNCATING
        return self.on_epoch_end_offset(ErrorCode.none, leader_epoch, end_offset, now_ms)

    def on_leader_offsets(self, error: ErrorCode, leader_start: int, leader_end: int, now_ms: int) -> None:
        """Kafka's fetchOffsetAndTruncate after OFFSET_OUT_OF_RANGE: a follower ahead of the
        leader's end truncates to it; one behind the leader's start restarts its log there."""
        if self.phase is not FetchPhase.RESETTING or self._on_epoch_error(error, now_ms):
            return
        log = self.log
        if leader_end < log.log_end_offset:
            log.truncate_to(leader_end)
        elif leader_start > log.log_end_offset:
            log.truncate_fully_and_start_at(leader_start)
        self.phase = FetchPhase.FETCHING
