"""What the group coordinator takes and gives back: request inputs, results, and its storage.

Results are plain values in Kafka's terms; handlers turn them into responses of whichever
protocol version the client speaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

from ...errors import ErrorCode
from .group import GroupState, JoinedMember, TopicPartition

CLASSIC_GROUP_TYPE = "classic"


# --- storage ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record of the offsets topic; `producer_id` >= 0 if its batch is transactional."""

    offset: int
    key: bytes
    value: bytes | None
    producer_id: int = -1


@dataclass(frozen=True, slots=True)
class StoredTxnMarker:
    """A COMMIT or ABORT control record of the offsets topic."""

    offset: int
    producer_id: int
    commit: bool


OnDurable = Callable[[ErrorCode, int], None]


class OffsetsStore(Protocol):
    """Where the coordinator's records live: the `__consumer_offsets` partitions."""

    def append(
        self,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        on_durable: OnDurable,
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> None:
        """Append the (key, value) records as one batch, transactional if producer_id >= 0.

        Later, or right away, call on_durable(ErrorCode.none, offset of the first record)
        once the batch is durable, or on_durable(error, -1) if it failed.
        """

    def load(self, partition: int) -> Iterable[StoredRecord | StoredTxnMarker | bytes]:
        """The partition in log order: records and transaction markers, or record sets of
        whole batches as the log holds them (the broker's store)."""


# --- requests and results ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveResult:
    error: ErrorCode
    member_errors: list[ErrorCode]  # one per leaving member, in request order


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.none


NO_OFFSET = FetchedOffset(-1, -1, "")


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    error: ErrorCode
    offsets: dict[TopicPartition, FetchedOffset]


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True, slots=True)
class ListGroupsResult:
    error: ErrorCode
    groups: list[GroupListing]


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """DescribeGroups' view; an unknown group is GROUP_ID_NOT_FOUND in state Dead."""

    group_id: str
    error: ErrorCode
    state: str = GroupState.DEAD.value
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    partitions: dict[TopicPartition, ErrorCode] = field(default_factory=dict)
