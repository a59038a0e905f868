"""The partition leader epoch handlers check requests against (KIP-320)."""

from __future__ import annotations

from ..errors import ErrorCode
from ..replication.epochs import check_current_leader_epoch

SINGLE_NODE_LEADER_EPOCH = 0


def partition_leader_epoch(broker, topic: str, partition: int) -> int:
    """This broker's leader epoch for the partition. A single node has led every partition
    since it was created, in epoch 0; the replica manager's `Partition.leader_epoch` takes
    over here once partitions change leaders."""
    return SINGLE_NODE_LEADER_EPOCH


def leader_epoch_error(broker, topic: str, partition: int, current_leader_epoch: int) -> ErrorCode:
    """FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a request naming another epoch (-1: no check)."""
    return check_current_leader_epoch(current_leader_epoch, partition_leader_epoch(broker, topic, partition))
