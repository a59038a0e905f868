"""Leader epoch checks a leader makes on requests (KIP-320, and KIP-595's diverging epoch in
Fetch) and its OffsetsForLeaderEpoch answer (KIP-101/KIP-279), shared by the Fetch,
ListOffsets and OffsetsForLeaderEpoch handlers and by follower fetchers."""

from __future__ import annotations

from ..errors import ErrorCode, KafkaError
from ..log.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEndOffset

__all__ = ["check_current_leader_epoch", "epoch_end_offset", "diverging_epoch", "NO_EPOCH_CHECK"]

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


def diverging_epoch(log, partition_epoch: int, last_fetched_epoch: int, fetch_offset: int) -> EpochEndOffset | None:
    """Kafka's check of a Fetch carrying `last_fetched_epoch` (v12+, KIP-595): where the
    fetcher's last epoch ends on this leader when its data diverged (the leader never had that
    epoch, or it ended before the fetch offset), else None. The fetcher truncates there and
    fetches again. Raises OFFSET_OUT_OF_RANGE when the leader cannot place the epoch or the
    offset is below its log start, so the fetcher resets as for any out-of-range offset."""
    found = epoch_end_offset(log, partition_epoch, last_fetched_epoch)
    if found.end_offset == UNDEFINED_EPOCH_OFFSET or found.leader_epoch == UNDEFINED_EPOCH:
        raise KafkaError(ErrorCode.offset_out_of_range,
                         f"the end offset of last fetched epoch {last_fetched_epoch} is unknown here")
    if fetch_offset < log.log_start_offset:
        raise KafkaError(ErrorCode.offset_out_of_range,
                         f"offset {fetch_offset} is below the log start {log.log_start_offset}")
    if found.leader_epoch < last_fetched_epoch or found.end_offset < fetch_offset:
        return found
    return None
