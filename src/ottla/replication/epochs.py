"""Leader epoch checks a leader makes on requests (KIP-320) and its OffsetsForLeaderEpoch
answer (KIP-101/KIP-279), shared by the Fetch, ListOffsets and OffsetsForLeaderEpoch handlers
and by follower fetchers."""

from __future__ import annotations

from ..errors import ErrorCode
from ..log.leader_epoch import EpochEndOffset

__all__ = ["check_current_leader_epoch", "epoch_end_offset", "NO_EPOCH_CHECK"]

NO_EPOCH_CHECK = -1  # a request's current_leader_epoch of -1 asks for no check


def check_current_leader_epoch(requested: int, partition_epoch: int) -> ErrorCode:
    """KIP-320: a client or follower whose metadata names an older leader epoch is fenced
    (FENCED_LEADER_EPOCH: refresh metadata); one that knows a newer epoch than this broker
    must wait for it to catch up (UNKNOWN_LEADER_EPOCH, retriable)."""
    if requested == NO_EPOCH_CHECK or requested == partition_epoch:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if requested < partition_epoch else ErrorCode.unknown_leader_epoch


def epoch_end_offset(log, partition_epoch: int, requested_epoch: int) -> EpochEndOffset:
    """The leader's answer for `requested_epoch`: its current epoch ends at its log end (Kafka's
    leader assigns that epoch on election, so its cache says the same even before it writes);
    older epochs end where the cache says the next one starts."""
    if requested_epoch == partition_epoch:
        return EpochEndOffset(partition_epoch, log.log_end_offset)
    return log.end_offset_for_epoch(requested_epoch)
