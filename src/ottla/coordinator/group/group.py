"""One classic group's state: members, generation, chosen protocol and committed offsets.

This is plain bookkeeping with Kafka's rules for membership, protocol choice and offset
staging. The coordinator drives it and owns everything with a time or a reply attached:
timers, storage, and the callbacks of requests waiting on the group.
"""

from __future__ import annotations

import enum
import struct
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

TopicPartition = tuple[str, int]

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    """Kafka's classic group states; the values are the names clients and tools show."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS_STATES = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.DEAD: set(GroupState),
}


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int | None = None
    # Where the commit record sits in __consumer_offsets. Commits that race (a transactional
    # one completing after a plain one) are ordered by it, the same order a reload sees.
    log_offset: int | None = None

    def logged_at(self, log_offset: int) -> "OffsetAndMetadata":
        """This commit once its record sits at `log_offset` (3x cheaper than `replace`)."""
        return OffsetAndMetadata(self.offset, self.leader_epoch, self.metadata, self.commit_timestamp,
                                 self.expire_timestamp, log_offset)

    def older_than(self, other: "OffsetAndMetadata") -> bool:
        return (self.log_offset if self.log_offset is not None else -1) < (
            other.log_offset if other.log_offset is not None else -1)


@dataclass(eq=False, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # in the member's order of preference
    assignment: bytes = b""
    # The reply of the member's JoinGroup/SyncGroup while the coordinator holds it.
    join_callback: Callable[[Any], None] | None = None
    sync_callback: Callable[[Any], None] | None = None
    # A member whose first JoinGroup has not been answered: it cannot heartbeat yet, so it
    # expires on the new-member timeout instead of being kept alive by the rebalance.
    is_new: bool = False

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_callback is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_callback is not None

    @property
    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: Sequence[tuple[str, bytes]]) -> bool:
        return list(protocols) == self.protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.protocols if name in candidates)


def subscribed_topics(metadata: bytes) -> set[str]:
    """Topics of a ConsumerProtocolSubscription, read as v0 which prefixes every version."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, set()
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            if length < 0 or pos + 2 + length > len(metadata):
                raise ValueError("bad topic name")
            topics.add(metadata[pos + 2:pos + 2 + length].decode())
            pos += 2 + length
        return topics
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


class Group:
    """A classic group, created Empty; `partition` is its __consumer_offsets partition."""

    def __init__(self, group_id: str, partition: int, now_ms: int, state: GroupState = GroupState.EMPTY):
        self.group_id = group_id
        self.partition = partition
        self.state = state
        self.state_timestamp: int | None = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: set[str] = set()  # ids handed out with MEMBER_ID_REQUIRED
        self.pending_sync_members: set[str] = set()  # joined this generation, no SyncGroup yet
        self.new_member_added = False  # lets the initial rebalance delay extend itself
        self.subscribed_topics: set[str] | None = None  # None: not a parseable consumer group
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self.pending_offset_commits: Counter[TopicPartition] = Counter()  # writes in flight
        self.pending_txn_offsets: dict[int, dict[TopicPartition, OffsetAndMetadata]] = {}

    def __repr__(self) -> str:
        return f"Group({self.group_id!r}, {self.state.value}, generation {self.generation_id})"

    # state -------------------------------------------------------------------------
    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS_STATES[state]:
            raise RuntimeError(f"group {self.group_id}: illegal transition {self.state.value} -> {state.value}")
        self.state = state
        self.state_timestamp = now_ms

    @property
    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    # membership --------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for member in self.members.values() if member.is_awaiting_join)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def add(self, member: Member) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(f"static member {member.group_instance_id} is already in group {self.group_id}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """Hand the instance's membership to a new member id; the old id is fenced from now on."""
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        self.static_members[group_instance_id] = new_member_id
        return member

    def current_static_member_id(self, group_instance_id: str | None) -> str | None:
        return None if group_instance_id is None else self.static_members.get(group_instance_id)

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        current = self.current_static_member_id(group_instance_id)
        return current is not None and current != member_id

    # protocols ---------------------------------------------------------------------
    def _candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        candidates = set(members[0].protocol_names) if members else set()
        for member in members[1:]:
            candidates &= member.protocol_names
        return candidates

    def supports_protocols(self, protocol_type: str, protocols: set[str]) -> bool:
        """Whether a member with these protocols could join without breaking the group's choice."""
        if self.is_in(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and bool(protocols & self._candidate_protocols())

    def select_protocol(self) -> str:
        """Each member votes for its favourite common protocol; most votes wins.

        Kafka leaves ties to hash-map order; here the protocol first voted for wins a tie.
        """
        candidates = self._candidate_protocols()
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return max(votes, key=lambda protocol: votes[protocol])

    # rebalance ---------------------------------------------------------------------
    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join == len(self.members) and not self.pending_members

    def not_yet_rejoined_members(self) -> list[Member]:
        return [member for member in self.members.values() if not member.is_awaiting_join]

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else promote any member that did; False if none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        joined = next((m for m in self.members.values() if m.is_awaiting_join), None)
        if joined is None:
            return False
        self.leader_id = joined.member_id
        return True

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        self.protocol_name = self.select_protocol() if self.members else None
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync_members.clear()
        self.transition_to(GroupState.COMPLETING_REBALANCE if self.members else GroupState.EMPTY, now_ms)

    def current_member_metadata(self) -> tuple[JoinedMember, ...]:
        """What the leader's JoinGroup response lists: every member's metadata for the chosen protocol."""
        assert self.protocol_name is not None
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def compute_subscribed_topics(self) -> set[str] | None:
        """What the members consume, so offsets of those topics are neither expired nor deleted."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        try:
            topics: set[str] = set()
            for member in self.members.values():
                topics |= subscribed_topics(member.metadata(self.protocol_name))
            return topics
        except ValueError:
            return None

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    # offsets -----------------------------------------------------------------------
    @property
    def has_offsets(self) -> bool:
        return bool(self.offsets or self.pending_offset_commits or self.pending_txn_offsets)

    def has_pending_commit(self, tp: TopicPartition) -> bool:
        return tp in self.pending_offset_commits or any(tp in staged for staged in self.pending_txn_offsets.values())

    def on_offset_commit_append(self, tp: TopicPartition, committed: OffsetAndMetadata) -> None:
        self._end_pending_commit(tp)
        current = self.offsets.get(tp)
        if current is None or current.older_than(committed):
            self.offsets[tp] = committed

    def fail_pending_offset_commit(self, tp: TopicPartition) -> None:
        self._end_pending_commit(tp)

    def _end_pending_commit(self, tp: TopicPartition) -> None:
        if self.pending_offset_commits[tp] <= 1:
            self.pending_offset_commits.pop(tp, None)
        else:
            self.pending_offset_commits[tp] -= 1

    def prepare_txn_offset_commit(self, producer_id: int, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.pending_txn_offsets.setdefault(producer_id, {}).update(offsets)

    def on_txn_offset_commit_append(self, producer_id: int, tp: TopicPartition, committed: OffsetAndMetadata) -> None:
        staged = self.pending_txn_offsets.get(producer_id)
        if staged is not None and tp in staged and replace(staged[tp], log_offset=None) == replace(committed, log_offset=None):
            staged[tp] = committed

    def fail_pending_txn_offset_commit(self, producer_id: int, tp: TopicPartition) -> None:
        staged = self.pending_txn_offsets.get(producer_id)
        if staged is not None:
            staged.pop(tp, None)
            if not staged:
                del self.pending_txn_offsets[producer_id]

    def complete_pending_txn_offset_commit(self, producer_id: int, commit: bool) -> None:
        """Apply (COMMIT) or drop (ABORT) what the producer's transaction committed here.

        A staged offset only wins over the current one if its record is later in the log,
        which is also what replaying the log yields.
        """
        staged = self.pending_txn_offsets.pop(producer_id, {})
        if not commit:
            return
        for tp, committed in staged.items():
            if committed.log_offset is None:
                continue  # never made it to the log, so the transaction cannot include it
            current = self.offsets.get(tp)
            if current is None or current.older_than(committed):
                self.offsets[tp] = committed

    def remove_offsets(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget these partitions' offsets (staged ones too); returns those that had one."""
        removed = []
        for tp in partitions:
            self.pending_offset_commits.pop(tp, None)
            for staged in self.pending_txn_offsets.values():
                staged.pop(tp, None)
            if self.offsets.pop(tp, None) is not None:
                removed.append(tp)
        return removed

    def remove_expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """KIP-211: offsets expire only once the group stopped using them.

        Empty group: retention counts from when it became Empty. Stable consumer group that
        knows its subscription: offsets of topics it no longer consumes, counted from their
        commit. Group without a protocol (a standalone consumer using Kafka only for offsets):
        counted from each commit. A commit with an explicit expire timestamp (OffsetCommit
        v2-v4 retention) keeps the old rule. In-flight commits never expire.
        """
        if self.protocol_type is not None and self.is_in(GroupState.EMPTY):
            def base(o: OffsetAndMetadata) -> int:
                return self.state_timestamp if self.state_timestamp is not None else o.commit_timestamp
            keep_topics: set[str] = set()
        elif (self.protocol_type == CONSUMER_PROTOCOL_TYPE and self.subscribed_topics is not None
              and self.is_in(GroupState.STABLE)):
            def base(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp
            keep_topics = self.subscribed_topics
        elif self.protocol_type is None:
            def base(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp
            keep_topics = set()
        else:
            return []
        expired = [
            tp for tp, o in self.offsets.items()
            if tp[0] not in keep_topics and tp not in self.pending_offset_commits and (
                now_ms >= o.expire_timestamp if o.expire_timestamp is not None
                else now_ms - base(o) >= retention_ms)
        ]
        for tp in expired:
            del self.offsets[tp]
        return expired
