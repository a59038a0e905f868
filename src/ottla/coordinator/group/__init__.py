"""Kafka's classic consumer group coordinator and the `__consumer_offsets` record formats."""

from .api import (
    FetchedOffset,
    GroupDescription,
    GroupListing,
    JoinResult,
    LeaveResult,
    LeavingMember,
    ListGroupsResult,
    MemberDescription,
    OffsetCommit,
    OffsetDeleteResult,
    OffsetFetchResult,
    OffsetsStore,
    StoredRecord,
    StoredTxnMarker,
    SyncResult,
)
from .coordinator import GroupCoordinator, PartitionLoader
from .group import GroupState, JoinedMember
from ..partitioning import partition_for
from .records import OFFSETS_TOPIC

__all__ = [
    "FetchedOffset", "GroupCoordinator", "GroupDescription", "GroupListing", "GroupState", "JoinResult",
    "JoinedMember", "LeaveResult", "LeavingMember", "ListGroupsResult", "MemberDescription", "OFFSETS_TOPIC",
    "OffsetCommit", "OffsetDeleteResult", "OffsetFetchResult", "OffsetsStore", "PartitionLoader",
    "StoredRecord", "StoredTxnMarker", "SyncResult", "partition_for",
]
