"""Kafka's classic group coordinator as a pure state machine.

h11 style: one method per request, plain arguments and an explicit `now_ms`; no sockets, no
asyncio, no clock. Requests that must wait (JoinGroup for the rebalance, SyncGroup for the
leader's assignment, anything that writes for durability) take an `on_complete` callable
that is invoked exactly once, possibly before the method returns. Timers (session,
rebalance, initial rebalance delay, pending sync, offset retention) fire in `poll(now_ms)`,
which the server calls periodically and tests call with whatever time they like.

Durability goes through an injected `OffsetsStore`: the coordinator writes Kafka's own
`__consumer_offsets` records and acknowledges commits and group changes only once the store
reports them durable. Replies and store appends are queued while an operation mutates state
and run after it, so a callback or a synchronously durable store never sees half an update.
Callbacks must not raise; an exception is logged and the remaining ones still run.

Time only moves forward here: a durable-callback that arrives between calls uses the latest
`now_ms` seen.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import uuid
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

from ...config import BrokerConfig
from ...errors import ErrorCode
from .api import (
    CLASSIC_GROUP_TYPE,
    NO_OFFSET,
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
    OnDurable,
    StoredRecord,
    StoredTxnMarker,
    SyncResult,
)
from .group import (
    CONSUMER_PROTOCOL_TYPE,
    Group,
    GroupState,
    Member,
    OffsetAndMetadata,
    TopicPartition,
)
from ..partitioning import partition_for
from .records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
)

log = logging.getLogger("ottla.group")

# A joining member cannot heartbeat until its first JoinGroup is answered, and a client that
# gave up on a long rebalance retries with a new request; Kafka drops such members after 5 min.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


# --- timers -----------------------------------------------------------------------------


@dataclass(slots=True)
class _DelayedJoin:
    """The pending end of a PreparingRebalance.

    `initial` is Kafka's InitialDelayedJoin for a group leaving Empty: it never completes
    early, and each expiry that saw new members waits another delay, within `remaining_ms`.
    """

    initial: bool
    delay_ms: int = 0
    remaining_ms: int = 0


class _Timers:
    """Deadlines keyed by what they guard; scheduling a key again replaces its deadline."""

    def __init__(self, on_schedule: Callable[[int], None] | None = None) -> None:
        self._on_schedule = on_schedule
        self._heap: list[tuple[int, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, int, Any]] = {}
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int, payload: Any = None) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline_ms, seq, payload)
        heapq.heappush(self._heap, (deadline_ms, seq, key))
        if self._on_schedule is not None:
            self._on_schedule(deadline_ms)

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def payload(self, key: Hashable) -> Any:
        entry = self._live.get(key)
        return None if entry is None else entry[2]

    def next_deadline(self) -> int | None:
        """The earliest live deadline (stale heap entries of rescheduled keys are dropped)."""
        while self._heap:
            deadline, seq, key = self._heap[0]
            entry = self._live.get(key)
            if entry is not None and entry[1] == seq:
                return deadline
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now_ms: int) -> tuple[Hashable, Any] | None:
        while self._heap and self._heap[0][0] <= now_ms:
            _, seq, key = heapq.heappop(self._heap)
            entry = self._live.get(key)
            if entry is not None and entry[1] == seq:
                del self._live[key]
                return key, entry[2]
        return None


def _store_error(error: ErrorCode, for_offsets: bool) -> ErrorCode:
    """Kafka's translation of a failed offsets-topic append into what group clients understand."""
    if error in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                 ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (ErrorCode.record_list_too_large, ErrorCode.message_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.invalid_commit_offset_size if for_offsets else ErrorCode.unknown_server_error
    return error


def _java_length(text: str) -> int:
    """String.length() in Java counts UTF-16 code units; offset.metadata.max.bytes is checked on it."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True, slots=True)
class _Join:
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool
    supports_skip_assignment: bool
    reason: str | None
    on_complete: Callable[[JoinResult], None]


class GroupCoordinator:
    """Classic consumer groups and their offsets for the `__consumer_offsets` partitions loaded here."""

    def __init__(self, config: BrokerConfig, store: OffsetsStore, *, num_partitions: int | None = None,
                 on_deadline: Callable[[int], None] | None = None):
        """`num_partitions` is the offsets topic's actual partition count when it already
        exists; like Kafka, that count and not offsets.topic.num.partitions decides where a
        group lives. `on_deadline(ms)` is told of every deadline scheduled, so the edge can
        arm a timer for it."""
        self.config = config
        self.store = store
        self.num_partitions: int = num_partitions or config["offsets.topic.num.partitions"]
        self._groups: dict[str, Group] = {}
        self._owned: set[int] = set()
        self._loading: set[int] = set()
        self._producer_groups: dict[int, set[str]] = {}  # producer id -> groups with staged txn offsets
        self._timers = _Timers(on_deadline)
        self._effects: deque[tuple[Callable[..., Any], tuple]] = deque()
        self._flushing = False
        self._now = 0
        self._next_retention_check: int | None = None
        self._firing = False

    # --- plumbing -----------------------------------------------------------------------
    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    @contextmanager
    def _operation(self, now_ms: int) -> Iterator[None]:
        """Every call happens at an explicit time, and whatever expired before then expires
        first: a request right after a session timeout sees the member gone, as in Kafka.
        (Deadlines equal to `now_ms` are left to `poll`, so calls at one instant see each other.)"""
        self._now = max(self._now, now_ms)
        try:
            self._fire_due(self._now - 1)
            yield
        finally:
            self._flush()

    def _defer(self, fn: Callable[..., Any], *args: Any) -> None:
        self._effects.append((fn, args))

    def _flush(self) -> None:
        if self._flushing:
            return
        self._flushing = True
        try:
            while self._effects:
                fn, args = self._effects.popleft()
                try:
                    fn(*args)
                except Exception:
                    log.exception("group coordinator callback %r failed", fn)
        finally:
            self._flushing = False

    def _append(self, partition: int, records: list[tuple[bytes, bytes | None]], on_durable: OnDurable,
                producer_id: int = -1, producer_epoch: int = -1) -> None:
        def durable(error: ErrorCode, offset: int) -> None:
            try:
                on_durable(error, offset)
            finally:
                self._flush()

        self._defer(lambda: self.store.append(partition, records, durable,
                                              producer_id=producer_id, producer_epoch=producer_epoch))

    def _status_error(self, group_id: str | None, empty_id_allowed: bool = False) -> ErrorCode | None:
        """Kafka's validateGroupStatus. Offset and admin APIs accept the empty group id."""
        if group_id is None or (not group_id and not empty_id_allowed):
            return ErrorCode.invalid_group_id
        partition = self.partition_for(group_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        if partition not in self._owned:
            return ErrorCode.not_coordinator
        return None

    def _add_group(self, group_id: str) -> Group:
        group = Group(group_id, self.partition_for(group_id), self._now)
        self._groups[group_id] = group
        return group

    def _remove_group(self, group: Group) -> None:
        """Forget a Dead group; requests naming it from now on see a fresh (or no) group."""
        if self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]
        self._timers.cancel(("join", group, None))
        self._timers.cancel(("sync", group, None))
        for member_id in group.members:
            self._timers.cancel(("heartbeat", group, member_id))
        for member_id in group.pending_members:
            self._timers.cancel(("pending", group, member_id))

    # callbacks held on members
    def _reply(self, callback: Callable[[Any], None], result: Any) -> None:
        self._defer(callback, result)

    def _complete_join(self, member: Member, result: JoinResult) -> None:
        if member.join_callback is not None:
            callback, member.join_callback = member.join_callback, None
            self._reply(callback, result)

    def _complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_callback is None:
            return False
        callback, member.sync_callback = member.sync_callback, None
        self._reply(callback, result)
        return True

    def _set_join_callback(self, member: Member, callback: Callable[[JoinResult], None]) -> None:
        # A client only repeats a JoinGroup after abandoning the first; answer the old one anyway.
        self._complete_join(member, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        member.join_callback = callback

    def _set_sync_callback(self, member: Member, callback: Callable[[SyncResult], None]) -> None:
        self._complete_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_callback = callback

    def _schedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        self._timers.schedule(("heartbeat", group, member.member_id), self._now + timeout)

    # --- partition ownership ------------------------------------------------------------
    def begin_load(self, partition: int) -> "PartitionLoader":
        """Start taking over a partition; its groups answer COORDINATOR_LOAD_IN_PROGRESS until finished."""
        self._loading.add(partition)
        return PartitionLoader(self, partition)

    def load_partition(self, partition: int, now_ms: int) -> None:
        """Load a partition in one go from the store."""
        loader = self.begin_load(partition)
        for item in self.store.load(partition):
            loader.replay(item)
        loader.finish(now_ms)

    def _install(self, loader: "PartitionLoader", now_ms: int) -> None:
        with self._operation(now_ms):
            group_ids = ({g for g, value in loader.groups.items() if value is not None}
                         | {g for g, offsets in loader.offsets.items() if offsets}
                         | {g for staged in loader.pending.values() for g, offsets in staged.items() if offsets})
            for group_id in group_ids:
                value = loader.groups.get(group_id)
                group = (Group(group_id, loader.partition, self._now) if value is None
                         else self._group_from_value(group_id, loader.partition, value))
                group.offsets = loader.offsets.get(group_id, {})
                for producer_id, staged in loader.pending.items():
                    if staged.get(group_id):
                        group.pending_txn_offsets[producer_id] = staged[group_id]
                        self._producer_groups.setdefault(producer_id, set()).add(group_id)
                self._groups[group_id] = group
                for member in group.members.values():
                    self._schedule_heartbeat(group, member)
            self._loading.discard(loader.partition)
            self._owned.add(loader.partition)
            log.debug("loaded %d groups from __consumer_offsets-%d", len(group_ids), loader.partition)

    def _group_from_value(self, group_id: str, partition: int, value: GroupMetadataValue) -> Group:
        """A group as last written; one with members resumes Stable and its members must heartbeat."""
        group = Group(group_id, partition, self._now, GroupState.STABLE if value.members else GroupState.EMPTY)
        group.state_timestamp = value.current_state_timestamp if value.current_state_timestamp >= 0 else None
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        for stored in value.members:
            member = Member(
                stored.member_id, stored.group_instance_id, stored.client_id, stored.client_host,
                stored.rebalance_timeout, stored.session_timeout, value.protocol_type,
                [(value.protocol or "", stored.subscription)], assignment=stored.assignment,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def unload_partition(self, partition: int, now_ms: int) -> None:
        """Give up a partition (shutdown, or another broker leads it): its groups die here."""
        with self._operation(now_ms):
            for group in [g for g in self._groups.values() if g.partition == partition]:
                group.transition_to(GroupState.DEAD, self._now)
                for member in group.members.values():
                    self._complete_join(member, JoinResult(ErrorCode.not_coordinator, member.member_id))
                    self._complete_sync(member, SyncResult(ErrorCode.not_coordinator))
                self._remove_group(group)
            self._owned.discard(partition)
            self._loading.discard(partition)

    # --- JoinGroup ----------------------------------------------------------------------
    def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        supports_skip_assignment: bool,
        now_ms: int,
        on_complete: Callable[[JoinResult], None],
        reason: str | None = None,
    ) -> None:
        """JoinGroup; answered when the rebalance completes, or at once on error.

        `require_known_member_id` is KIP-394 (JoinGroup v4+): a dynamic member's first join
        gets MEMBER_ID_REQUIRED and its id. `supports_skip_assignment` is KIP-814 (v9+).
        """
        with self._operation(now_ms):
            error = self._status_error(group_id)
            if error is None and not (self.config["group.min.session.timeout.ms"] <= session_timeout_ms
                                      <= self.config["group.max.session.timeout.ms"]):
                error = ErrorCode.invalid_session_timeout
            group = self._groups.get(group_id)
            if error is None and group is None and member_id:
                error = ErrorCode.unknown_member_id
            if error is not None:
                self._reply(on_complete, JoinResult(error, member_id))
                return
            if group is None:
                group = self._add_group(group_id)
            join = _Join(member_id, group_instance_id, protocol_type, list(protocols), session_timeout_ms,
                         rebalance_timeout_ms, client_id, client_host,
                         require_known_member_id and group_instance_id is None, supports_skip_assignment,
                         reason, on_complete)
            if not self._accept_joining_member(group, member_id):
                removed = group.remove(member_id)
                if removed is not None:
                    self._timers.cancel(("heartbeat", group, member_id))
                self._reply(on_complete, JoinResult(ErrorCode.group_max_size_reached, ""))
            elif not member_id:
                self._join_new_member(group, join)
            else:
                self._join_current_member(group, join)
            if group.is_in(GroupState.PREPARING_REBALANCE):
                self._try_complete_join(group)

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        """group.max.size: while rebalancing, count members that rejoined; otherwise all members."""
        max_size = self.config["group.max.size"]
        if group.is_in(GroupState.EMPTY):
            return True
        if group.is_in(GroupState.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            return (member is not None and member.is_awaiting_join) or group.num_awaiting_join < max_size
        return member_id in group.members or group.size < max_size

    def _join_new_member(self, group: Group, join: _Join) -> None:
        if not group.supports_protocols(join.protocol_type, {name for name, _ in join.protocols}):
            self._reply(join.on_complete, JoinResult(ErrorCode.inconsistent_group_protocol, ""))
            return
        new_member_id = f"{join.group_instance_id or join.client_id}-{uuid.uuid4()}"
        if join.group_instance_id is not None:
            old_member_id = group.current_static_member_id(join.group_instance_id)
            if old_member_id is not None:
                self._replace_static_member(group, old_member_id, new_member_id, join)
            else:
                self._add_member_and_rebalance(group, new_member_id, join)
        elif join.require_known_member_id:
            group.pending_members.add(new_member_id)
            self._timers.schedule(("pending", group, new_member_id), self._now + join.session_timeout_ms)
            self._reply(join.on_complete, JoinResult(ErrorCode.member_id_required, new_member_id))
        else:
            self._add_member_and_rebalance(group, new_member_id, join)

    def _join_current_member(self, group: Group, join: _Join) -> None:
        member_id = join.member_id
        if not group.supports_protocols(join.protocol_type, {name for name, _ in join.protocols}):
            self._reply(join.on_complete, JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
        elif member_id in group.pending_members:
            if join.group_instance_id is not None:
                # Static members never get a pending id; make the client start over.
                self._reply(join.on_complete, JoinResult(ErrorCode.unknown_member_id, member_id))
            else:
                self._add_member_and_rebalance(group, member_id, join)
        elif group.is_static_member_fenced(join.group_instance_id, member_id):
            self._reply(join.on_complete, JoinResult(ErrorCode.fenced_instance_id, member_id))
        elif member_id not in group.members or (
                join.group_instance_id is not None
                and group.current_static_member_id(join.group_instance_id) is None):
            self._reply(join.on_complete, JoinResult(ErrorCode.unknown_member_id, member_id))
        else:
            member = group.members[member_id]
            if group.is_in(GroupState.PREPARING_REBALANCE):
                self._update_member_and_rebalance(group, member, join, "member joining during rebalance")
            elif group.is_in(GroupState.COMPLETING_REBALANCE) and member.matches(join.protocols):
                # Same metadata: it missed the JoinGroup response. Resend this generation's.
                self._reply(join.on_complete, self._generation_result(group, member_id, include_members=True))
            elif group.is_in(GroupState.STABLE) and not group.is_leader(member_id) and member.matches(join.protocols):
                # A follower with nothing new just gets the generation back and syncs again.
                self._reply(join.on_complete, self._generation_result(group, member_id, include_members=False))
            else:
                # Changed metadata, or the leader asking for a rebalance (e.g. topic metadata changed).
                self._update_member_and_rebalance(group, member, join, "member metadata changed or leader rejoined")

    def _generation_result(self, group: Group, member_id: str, include_members: bool) -> JoinResult:
        leader = group.is_leader(member_id)
        return JoinResult(
            ErrorCode.none, member_id, group.generation_id, group.protocol_type, group.protocol_name,
            group.leader_id or "", members=group.current_member_metadata() if include_members and leader else (),
        )

    def _add_member_and_rebalance(self, group: Group, member_id: str, join: _Join) -> None:
        member = Member(member_id, join.group_instance_id, join.client_id, join.client_host,
                        join.rebalance_timeout_ms, join.session_timeout_ms, join.protocol_type,
                        list(join.protocols), is_new=True)
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        member.join_callback = join.on_complete
        self._timers.cancel(("pending", group, member_id))
        self._schedule_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id} (reason: {join.reason})")

    def _update_member(self, member: Member, join: _Join) -> None:
        member.protocols = list(join.protocols)
        member.rebalance_timeout_ms = join.rebalance_timeout_ms
        member.session_timeout_ms = join.session_timeout_ms
        self._set_join_callback(member, join.on_complete)

    def _update_member_and_rebalance(self, group: Group, member: Member, join: _Join, why: str) -> None:
        self._update_member(member, join)
        self._maybe_prepare_rebalance(group, f"{why}: {member.member_id} (reason: {join.reason})")

    def _replace_static_member(self, group: Group, old_member_id: str, new_member_id: str, join: _Join) -> None:
        """KIP-345: a static member came back with a new id; fence the old id and, if nothing
        it offers changes the group's protocol, keep the generation: no rebalance."""
        assert join.group_instance_id is not None
        old_leader = group.leader_id or ""
        member = group.members[old_member_id]
        self._complete_join(member, JoinResult(ErrorCode.fenced_instance_id, old_member_id))
        self._complete_sync(member, SyncResult(ErrorCode.fenced_instance_id))
        self._timers.cancel(("heartbeat", group, old_member_id))
        group.replace_static_member(join.group_instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat(group, member)
        previous = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        self._update_member(member, join)
        why = f"static member {join.group_instance_id} rejoined as {new_member_id} (reason: {join.reason})"
        if group.is_in(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                generation = group.generation_id
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                self._store_group(group, assignment, lambda error: self._on_static_member_stored(
                    group, member, generation, old_member_id, previous, old_leader, join, error))
            else:
                self._maybe_prepare_rebalance(group, why + " with a change of protocol")
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            # The leader may be assigning to the old id; only a new generation is consistent.
            self._prepare_rebalance(group, why)
        # PreparingRebalance: the join in progress answers it.

    def _on_static_member_stored(self, group: Group, member: Member, generation: int, old_member_id: str,
                                 previous: tuple, old_leader: str, join: _Join, error: ErrorCode) -> None:
        new_member_id = member.member_id
        if (not group.is_in(GroupState.STABLE) or group.generation_id != generation
                or group.members.get(new_member_id) is not member or member.join_callback is not join.on_complete):
            return  # a rebalance overtook the write; it answers the member
        if error != ErrorCode.none:
            # Not durable: restore the old id so the group matches what is on disk.
            member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms = previous
            member.join_callback = None
            self._timers.cancel(("heartbeat", group, new_member_id))
            assert member.group_instance_id is not None
            group.replace_static_member(member.group_instance_id, new_member_id, old_member_id)
            self._schedule_heartbeat(group, member)
            self._reply(join.on_complete, JoinResult(
                _store_error(error, for_offsets=False), "", group.generation_id, group.protocol_type,
                group.protocol_name, old_leader))
        elif join.supports_skip_assignment:
            # KIP-814: a static leader learns it leads, to watch metadata, but must not reassign.
            leader = group.is_leader(new_member_id)
            self._complete_join(member, JoinResult(
                ErrorCode.none, new_member_id, group.generation_id, group.protocol_type, group.protocol_name,
                group.leader_id or "", skip_assignment=leader,
                members=group.current_member_metadata() if leader else ()))
        else:
            # Older clients: report the old leader id so a returning leader does not reassign.
            self._complete_join(member, JoinResult(
                ErrorCode.none, new_member_id, group.generation_id, group.protocol_type, group.protocol_name,
                old_leader))

    # --- rebalance ----------------------------------------------------------------------
    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        self._timers.cancel(("sync", group, None))
        if group.is_in(GroupState.EMPTY):
            delay = self.config["group.initial.rebalance.delay.ms"]
            delayed = _DelayedJoin(True, delay, max(group.rebalance_timeout_ms - delay, 0))
        else:
            delay = group.rebalance_timeout_ms
            delayed = _DelayedJoin(False)
        log.info("preparing to rebalance group %s in state %s with old generation %d (%s)",
                 group.group_id, group.state.value, group.generation_id, reason)
        group.transition_to(GroupState.PREPARING_REBALANCE, self._now)
        self._timers.schedule(("join", group, None), self._now + delay, delayed)
        self._try_complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        delayed = self._timers.payload(("join", group, None))
        if delayed is not None and not delayed.initial and group.has_all_members_joined():
            self._timers.cancel(("join", group, None))
            self._complete_rebalance_join(group)

    def _on_join_expired(self, group: Group, _: None, delayed: _DelayedJoin) -> None:
        if delayed.initial and group.new_member_added and delayed.remaining_ms:
            group.new_member_added = False
            delay = min(self.config["group.initial.rebalance.delay.ms"], delayed.remaining_ms)
            remaining = max(delayed.remaining_ms - delayed.delay_ms, 0)
            self._timers.schedule(("join", group, None), self._now + delay, _DelayedJoin(True, delay, remaining))
        else:
            self._complete_rebalance_join(group)

    def _complete_rebalance_join(self, group: Group) -> None:
        """End of PreparingRebalance: drop dynamic members that did not rejoin, start the generation."""
        for member in group.not_yet_rejoined_members():
            if member.group_instance_id is None:
                self._drop_member(group, member, ErrorCode.unknown_member_id)
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined are left; wait for them or their session.
            log.error("group %s could not complete rebalance because no members rejoined", group.group_id)
            self._timers.schedule(("join", group, None), self._now + group.rebalance_timeout_ms, _DelayedJoin(False))
            return
        group.init_next_generation(self._now)
        if group.is_in(GroupState.EMPTY):
            log.info("group %s with generation %d is now empty", group.group_id, group.generation_id)

            def stored(error: ErrorCode) -> None:
                # Harmless: the previous generation on disk has no live members either.
                if error != ErrorCode.none:
                    log.warning("failed to write empty metadata for group %s: %s", group.group_id, error.name)

            self._store_group(group, {}, stored)
            return
        log.info("stabilized group %s generation %d with %d members",
                 group.group_id, group.generation_id, group.size)
        for member in group.members.values():
            self._complete_join(member, self._generation_result(group, member.member_id, include_members=True))
            self._schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        self._timers.schedule(("sync", group, None), self._now + group.rebalance_timeout_ms, group.generation_id)

    def _on_sync_expired(self, group: Group, _: None, generation: int) -> None:
        """Members that got the JoinGroup response but never synced within the rebalance timeout."""
        if generation != group.generation_id or not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if group.pending_sync_members:
            missing = sorted(group.pending_sync_members)
            for member_id in missing:
                self._drop_member(group, group.members[member_id], ErrorCode.unknown_member_id)
            self._prepare_rebalance(group, f"removing {missing} on pending sync request expiration")

    def _remove_pending_sync_member(self, group: Group, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            self._timers.cancel(("sync", group, None))

    def _drop_member(self, group: Group, member: Member, error: ErrorCode) -> None:
        """Remove a member without touching the group's state; its waiting requests get `error`."""
        self._complete_join(member, JoinResult(error, ""))
        self._complete_sync(member, SyncResult(error))
        group.remove(member.member_id)
        self._timers.cancel(("heartbeat", group, member.member_id))

    def _remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        self._drop_member(group, member, ErrorCode.unknown_member_id)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_in(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _remove_pending_member_and_update_group(self, group: Group, member_id: str) -> None:
        group.remove(member_id)
        self._timers.cancel(("pending", group, member_id))
        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _reset_and_propagate_assignment_error(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: Group, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in group.members.values():
            result = SyncResult(error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                                member.assignment)
            if self._complete_sync(member, result):
                # Its session may have lapsed while it waited; it gets a full one from now.
                self._schedule_heartbeat(group, member)

    def _on_heartbeat_expired(self, group: Group, member_id: str, _: None) -> None:
        member = group.members.get(member_id)
        # Members waiting on a rebalance need not heartbeat, except a new member that never joined.
        if member is not None and (member.is_new or not (member.is_awaiting_join or member.is_awaiting_sync)):
            log.info("member %s in group %s has failed, removing it from the group", member_id, group.group_id)
            self._remove_member_and_update_group(group, member, f"removing member {member_id} on heartbeat expiration")

    def _on_pending_member_expired(self, group: Group, member_id: str, _: None) -> None:
        if member_id in group.pending_members:
            self._remove_pending_member_and_update_group(group, member_id)

    # --- SyncGroup ----------------------------------------------------------------------
    def sync_group(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        now_ms: int,
        on_complete: Callable[[SyncResult], None],
    ) -> None:
        """SyncGroup; the leader's carries the assignment, everyone's waits until it is durable."""
        with self._operation(now_ms):
            error = self._status_error(group_id)
            if error == ErrorCode.coordinator_load_in_progress:
                # The rebalance state was lost with the old coordinator: rejoin, do not rediscover.
                error = ErrorCode.rebalance_in_progress
            group = self._groups.get(group_id)
            if error is None and group is None:
                error = ErrorCode.unknown_member_id
            if error is None:
                assert group is not None
                error = self._validate_current_member(group, member_id, group_instance_id)
                if error is None and generation_id != group.generation_id:
                    error = ErrorCode.illegal_generation
                if error is None and ((protocol_type is not None and protocol_type != group.protocol_type)
                                      or (protocol_name is not None and protocol_name != group.protocol_name)):
                    error = ErrorCode.inconsistent_group_protocol
                if error is None and group.is_in(GroupState.PREPARING_REBALANCE):
                    error = ErrorCode.rebalance_in_progress
            if error is not None:
                self._reply(on_complete, SyncResult(error))
                return
            assert group is not None
            member = group.members[member_id]
            if group.is_in(GroupState.STABLE):
                self._remove_pending_sync_member(group, member_id)
                self._reply(on_complete, SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name,
                                                    member.assignment))
                self._schedule_heartbeat(group, member)
                return
            self._set_sync_callback(member, on_complete)
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                assignment = {mid: assignments.get(mid, b"") for mid in group.members}
                generation = group.generation_id
                self._store_group(group, assignment,
                                  lambda err: self._on_assignment_stored(group, generation, assignment, err))

    def _on_assignment_stored(self, group: Group, generation: int, assignment: dict[str, bytes],
                              error: ErrorCode) -> None:
        if not group.is_in(GroupState.COMPLETING_REBALANCE) or group.generation_id != generation:
            return  # someone joined or left meanwhile; that rebalance answers the members
        if error != ErrorCode.none:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, "error when storing the group assignment")
            return
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.none)
        group.transition_to(GroupState.STABLE, self._now)

    def _store_group(self, group: Group, assignment: Mapping[str, bytes],
                     on_done: Callable[[ErrorCode], Any]) -> None:
        protocol = group.protocol_name
        value = GroupMetadataValue(
            group.protocol_type or "", group.generation_id, protocol, group.leader_id,
            group.state_timestamp if group.state_timestamp is not None else -1,
            tuple(MemberMetadataValue(
                m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                m.session_timeout_ms, m.metadata(protocol) if protocol is not None else b"",
                assignment[m.member_id],
            ) for m in group.members.values()),
        )
        record = (encode_key(GroupMetadataKey(group.group_id)), encode_group_metadata_value(value))
        self._append(group.partition, [record], lambda error, _: on_done(_store_error(error, for_offsets=False)))

    # --- Heartbeat and LeaveGroup -------------------------------------------------------
    def heartbeat(self, *, group_id: str, member_id: str, group_instance_id: str | None,
                  generation_id: int, now_ms: int) -> ErrorCode:
        with self._operation(now_ms):
            error = self._status_error(group_id)
            if error == ErrorCode.coordinator_load_in_progress:
                return ErrorCode.none  # the group is not known yet; do not make the member rejoin
            if error is not None:
                return error
            group = self._groups.get(group_id)
            if group is None:
                return ErrorCode.unknown_member_id
            if group.is_static_member_fenced(group_instance_id, member_id):
                return ErrorCode.fenced_instance_id
            member = group.members.get(member_id)
            if member is None:
                return ErrorCode.unknown_member_id
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
            self._schedule_heartbeat(group, member)
            if group.is_in(GroupState.PREPARING_REBALANCE):
                return ErrorCode.rebalance_in_progress
            return ErrorCode.none

    def leave_group(self, *, group_id: str, members: Sequence[LeavingMember], now_ms: int) -> LeaveResult:
        """LeaveGroup; an empty member id with an instance id is the admin removing a static member."""
        with self._operation(now_ms):
            error = self._status_error(group_id)
            if error is not None:
                return LeaveResult(error, [])
            group = self._groups.get(group_id)
            if group is None:
                return LeaveResult(ErrorCode.none, [ErrorCode.unknown_member_id] * len(members))
            errors = []
            for leaving in members:
                reason = f"removing member {leaving.member_id or leaving.group_instance_id} on LeaveGroup" \
                         f" (reason: {leaving.reason})"
                if not leaving.member_id:
                    current = group.current_static_member_id(leaving.group_instance_id)
                    if current is None:
                        errors.append(ErrorCode.unknown_member_id)
                        continue
                    self._remove_member_and_update_group(group, group.members[current], reason)
                elif leaving.member_id in group.pending_members:
                    self._remove_pending_member_and_update_group(group, leaving.member_id)
                else:
                    error = self._validate_current_member(group, leaving.member_id, leaving.group_instance_id)
                    if error is not None:
                        errors.append(error)
                        continue
                    self._remove_member_and_update_group(group, group.members[leaving.member_id], reason)
                errors.append(ErrorCode.none)
            return LeaveResult(ErrorCode.none, errors)

    def _validate_current_member(self, group: Group, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        if group_instance_id is not None:
            current = group.current_static_member_id(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return None

    # --- offsets ------------------------------------------------------------------------
    def commit_offsets(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetCommit],
        now_ms: int,
        on_complete: Callable[[dict[TopicPartition, ErrorCode]], None],
        retention_ms: int = -1,
    ) -> None:
        """OffsetCommit; answered per partition once the records are durable.

        Generation -1 with no member id is a consumer not using group management: allowed
        while the group is Empty (and creates it). An unknown group with a generation gets
        GROUP_ID_NOT_FOUND, which OffsetCommit before v9 reports as ILLEGAL_GENERATION.
        `retention_ms` is OffsetCommit v2-v4's retention_time_ms (-1: broker default).
        """
        with self._operation(now_ms):
            error = self._status_error(group_id, empty_id_allowed=True)
            group = self._groups.get(group_id)
            if error is None and group is None and generation_id >= 0:
                error = ErrorCode.group_id_not_found
            if error is None:
                if group is None:
                    group = self._add_group(group_id)
                error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id, False)
                if error is None and group.is_in(GroupState.COMPLETING_REBALANCE):
                    # A member of this generation commits before syncing; let it finish the rebalance.
                    error = ErrorCode.rebalance_in_progress
            if error is not None:
                self._reply(on_complete, {tp: error for tp in offsets})
                return
            assert group is not None
            if group.is_in(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                self._schedule_heartbeat(group, group.members[member_id])
            expire = None if retention_ms == -1 else self._now + retention_ms
            self._store_offsets(group, offsets, expire, on_complete)

    def txn_offset_commit(
        self,
        *,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetCommit],
        now_ms: int,
        on_complete: Callable[[dict[TopicPartition, ErrorCode]], None],
    ) -> None:
        """TxnOffsetCommit: staged for the producer until its transaction's marker lands.

        The offsets become visible on `complete_txn(commit=True)` and are dropped on abort.
        Versions before 3 send no member or generation, and are accepted in any state.
        """
        with self._operation(now_ms):
            error = self._status_error(group_id)
            group = self._groups.get(group_id)
            if error is None and group is None and generation_id >= 0:
                error = ErrorCode.illegal_generation
            if error is None:
                if group is None:
                    group = self._add_group(group_id)
                error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id, True)
            if error is not None:
                self._reply(on_complete, {tp: error for tp in offsets})
                return
            assert group is not None
            self._store_offsets(group, offsets, None, on_complete, producer_id, producer_epoch)

    def complete_txn(self, *, producer_id: int, partitions: Iterable[int], commit: bool, now_ms: int) -> None:
        """The producer's COMMIT/ABORT marker is durable in these offsets-topic partitions."""
        with self._operation(now_ms):
            done = set(partitions)
            group_ids = self._producer_groups.get(producer_id, set())
            for group_id in list(group_ids):
                group = self._groups.get(group_id)
                if group is None:
                    group_ids.discard(group_id)
                elif group.partition in done:
                    group.complete_pending_txn_offset_commit(producer_id, commit)
                    group_ids.discard(group_id)
            if not group_ids:
                self._producer_groups.pop(producer_id, None)

    def _validate_offset_commit(self, group: Group, generation_id: int, member_id: str,
                                group_instance_id: str | None, transactional: bool) -> ErrorCode | None:
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error is None and generation_id != group.generation_id:
                error = ErrorCode.illegal_generation
            return error
        if not transactional and not group.is_in(GroupState.EMPTY):
            return ErrorCode.unknown_member_id  # only members commit to a group in use
        return None

    def _store_offsets(self, group: Group, offsets: Mapping[TopicPartition, OffsetCommit], expire: int | None,
                       on_complete: Callable[[dict[TopicPartition, ErrorCode]], None],
                       producer_id: int = -1, producer_epoch: int = -1) -> None:
        results: dict[TopicPartition, ErrorCode] = {}
        staged: dict[TopicPartition, OffsetAndMetadata] = {}
        max_metadata = self.config["offset.metadata.max.bytes"]
        for tp, commit in offsets.items():
            metadata = commit.metadata or ""
            if _java_length(metadata) > max_metadata:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                staged[tp] = OffsetAndMetadata(commit.offset, commit.leader_epoch, metadata, self._now, expire)
        if not staged:
            self._reply(on_complete, results)
            return
        transactional = producer_id >= 0
        if transactional:
            group.prepare_txn_offset_commit(producer_id, staged)
            self._producer_groups.setdefault(producer_id, set()).add(group.group_id)
        else:
            group.pending_offset_commits.update(staged.keys())
        records = [
            (encode_key(OffsetCommitKey(group.group_id, topic, partition)),
             encode_offset_commit_value(OffsetCommitValue(
                 o.offset, o.metadata, o.commit_timestamp, o.leader_epoch,
                 o.expire_timestamp if o.expire_timestamp is not None else -1)))
            for (topic, partition), o in staged.items()
        ]

        def durable(error: ErrorCode, base_offset: int) -> None:
            if not group.is_in(GroupState.DEAD):
                for i, (tp, o) in enumerate(staged.items()):
                    if error != ErrorCode.none:
                        if transactional:
                            group.fail_pending_txn_offset_commit(producer_id, tp)
                        else:
                            group.fail_pending_offset_commit(tp)
                    elif transactional:
                        group.on_txn_offset_commit_append(producer_id, tp, replace(o, log_offset=base_offset + i))
                    else:
                        group.on_offset_commit_append(tp, replace(o, log_offset=base_offset + i))
            mapped = _store_error(error, for_offsets=True)
            results.update((tp, mapped) for tp in staged)
            self._reply(on_complete, {tp: results[tp] for tp in offsets})

        self._append(group.partition, records, durable, producer_id, producer_epoch)

    def fetch_offsets(self, *, group_id: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool = False) -> OffsetFetchResult:
        """OffsetFetch; `partitions` None means all of the group's. KIP-447 `require_stable`
        answers UNSTABLE_OFFSET_COMMIT where a commit (transactional or not) is in flight."""
        error = self._status_error(group_id, empty_id_allowed=True)
        if error is not None:
            return OffsetFetchResult(error, {})
        group = self._groups.get(group_id)
        if group is None:
            return OffsetFetchResult(ErrorCode.none, {tp: NO_OFFSET for tp in partitions or ()})
        result = {}
        for tp in (list(group.offsets) if partitions is None else partitions):
            committed = group.offsets.get(tp)
            if require_stable and group.has_pending_commit(tp):
                result[tp] = FetchedOffset(-1, -1, "", ErrorCode.unstable_offset_commit)
            elif committed is None:
                result[tp] = NO_OFFSET
            else:
                result[tp] = FetchedOffset(committed.offset, committed.leader_epoch, committed.metadata)
        return OffsetFetchResult(ErrorCode.none, result)

    def delete_offsets(self, *, group_id: str, partitions: Sequence[TopicPartition], now_ms: int,
                       on_complete: Callable[[OffsetDeleteResult], None]) -> None:
        """OffsetDelete: allowed on an Empty group, or for topics a consumer group does not consume."""
        with self._operation(now_ms):
            error = self._status_error(group_id)
            group = self._groups.get(group_id)
            if error is None and group is None:
                error = ErrorCode.group_id_not_found
            if error is None and group is not None and not group.is_in(GroupState.EMPTY) \
                    and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                error = ErrorCode.non_empty_group
            if error is not None:
                self._reply(on_complete, OffsetDeleteResult(error))
                return
            assert group is not None
            results = {tp: (ErrorCode.group_subscribed_to_topic if group.is_subscribed_to_topic(tp[0])
                            else ErrorCode.none) for tp in partitions}
            eligible = [tp for tp, e in results.items() if e == ErrorCode.none]
            if not eligible:
                self._reply(on_complete, OffsetDeleteResult(ErrorCode.none, results))
                return

            def durable(error: ErrorCode) -> None:
                self._reply(on_complete, OffsetDeleteResult(error, {} if error != ErrorCode.none else results))

            self._cleanup_group_metadata(group, group.remove_offsets(eligible), durable)

    def delete_groups(self, *, group_ids: Sequence[str], now_ms: int,
                      on_complete: Callable[[dict[str, ErrorCode]], None]) -> None:
        """DeleteGroups: only Empty groups go, with tombstones for their offsets and metadata."""
        with self._operation(now_ms):
            results: dict[str, ErrorCode] = {}
            deleting = []
            for group_id in group_ids:
                error = self._status_error(group_id, empty_id_allowed=True)
                group = self._groups.get(group_id)
                if error is None and group is None:
                    error = ErrorCode.group_id_not_found
                elif error is None and group is not None and not group.is_in(GroupState.EMPTY):
                    error = ErrorCode.non_empty_group
                if error is not None:
                    results[group_id] = error
                else:
                    deleting.append(group)
            if not deleting:
                self._reply(on_complete, results)
                return
            outstanding = len(deleting)

            def durable(group_id: str, error: ErrorCode) -> None:
                nonlocal outstanding
                results[group_id] = error
                outstanding -= 1
                if outstanding == 0:
                    self._reply(on_complete, {g: results[g] for g in group_ids})

            for group in deleting:
                group.transition_to(GroupState.DEAD, self._now)
                self._cleanup_group_metadata(group, group.remove_offsets(list(group.offsets)),
                                             lambda error, g=group.group_id: durable(g, error))

    def on_topics_deleted(self, topics: Iterable[str], now_ms: int) -> None:
        """Drop every group's offsets of deleted topics, with tombstones, as Kafka does: a topic
        created again under the same name must not resume at the old one's positions."""
        with self._operation(now_ms):
            deleted = set(topics)
            for group in list(self._groups.values()):
                known = set(group.offsets) | set(group.pending_offset_commits)
                for staged in group.pending_txn_offsets.values():
                    known |= set(staged)
                gone = [tp for tp in known if tp[0] in deleted]
                if gone:
                    self._cleanup_group_metadata(group, group.remove_offsets(gone))

    def _cleanup_group_metadata(self, group: Group, removed: list[TopicPartition],
                                on_done: Callable[[ErrorCode], None] | None = None) -> None:
        """Write tombstones for removed offsets; an Empty group left without offsets dies too."""
        if group.is_in(GroupState.EMPTY) and not group.has_offsets:
            log.info("group %s transitioned to Dead in generation %d", group.group_id, group.generation_id)
            group.transition_to(GroupState.DEAD, self._now)
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetCommitKey(group.group_id, topic, partition)), None) for topic, partition in removed]
        if group.is_in(GroupState.DEAD):
            self._remove_group(group)
            records.append((encode_key(GroupMetadataKey(group.group_id)), None))

        def durable(error: ErrorCode, _: int) -> None:
            mapped = _store_error(error, for_offsets=False)
            if mapped != ErrorCode.none:
                log.warning("failed to write tombstones for group %s: %s", group.group_id, mapped.name)
            if on_done is not None:
                on_done(mapped)

        if records:
            self._append(group.partition, records, durable)
        elif on_done is not None:
            on_done(ErrorCode.none)

    # --- admin views --------------------------------------------------------------------
    def list_groups(self, *, states: Iterable[str] = (), types: Iterable[str] = ()) -> ListGroupsResult:
        """ListGroups with KIP-518 state and KIP-848 type filters (case-insensitive; all groups are classic)."""
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        groups = [] if wanted_types and CLASSIC_GROUP_TYPE not in wanted_types else [
            GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if not wanted_states or g.state.value.lower() in wanted_states
        ]
        error = ErrorCode.coordinator_load_in_progress if self._loading else ErrorCode.none
        return ListGroupsResult(error, groups)

    def describe_group(self, group_id: str) -> GroupDescription:
        error = self._status_error(group_id, empty_id_allowed=True)
        if error is not None:
            return GroupDescription(group_id, error, state="")
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, ErrorCode.group_id_not_found)
        stable = group.is_in(GroupState.STABLE) and group.protocol_name is not None
        members = tuple(
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(group.protocol_name) if stable and group.protocol_name is not None else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(group_id, ErrorCode.none, group.state.value, group.protocol_type or "",
                                (group.protocol_name or "") if stable else "", members)

    # --- time ---------------------------------------------------------------------------
    def next_deadline(self) -> int | None:
        """When `poll` next has something to do (ms, the clock `now_ms` uses); the asyncio
        edge arms one timer for it instead of polling on a tick."""
        deadlines = [d for d in (self._timers.next_deadline(), self._next_retention_check) if d is not None]
        return min(deadlines) if deadlines else None

    def _fire_due(self, until_ms: int) -> None:
        if self._firing:
            return
        handlers = {
            "heartbeat": self._on_heartbeat_expired,
            "pending": self._on_pending_member_expired,
            "join": self._on_join_expired,
            "sync": self._on_sync_expired,
        }
        self._firing = True
        try:
            while (due := self._timers.pop_due(until_ms)) is not None:
                (kind, group, member_id), payload = due
                handlers[kind](group, member_id, payload)
        finally:
            self._firing = False

    def poll(self, now_ms: int) -> None:
        """Fire every timer due by `now_ms`, and expire offsets every offsets.retention.check.interval.ms."""
        with self._operation(now_ms):
            self._fire_due(self._now)
            interval = self.config["offsets.retention.check.interval.ms"]
            if self._next_retention_check is None:
                self._next_retention_check = self._now + interval
            elif self._now >= self._next_retention_check:
                self._next_retention_check = self._now + interval
                self._expire_offsets()

    def _expire_offsets(self) -> None:
        retention_ms = self.config["offsets.retention.minutes"] * 60 * 1000
        for group in list(self._groups.values()):
            expired = group.remove_expired_offsets(self._now, retention_ms)
            if expired or (group.is_in(GroupState.EMPTY) and not group.has_offsets):
                self._cleanup_group_metadata(group, expired)


class PartitionLoader:
    """Replays one `__consumer_offsets` partition into groups, the way Kafka loads it.

    Transactional offset commits are held per producer until that producer's marker: a
    COMMIT applies them (unless a later record in the log overrode the offset), an ABORT
    drops them, and what is still open at the end stays pending in the group.
    """

    def __init__(self, coordinator: GroupCoordinator, partition: int):
        self._coordinator = coordinator
        self.partition = partition
        self.groups: dict[str, GroupMetadataValue | None] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}

    def replay(self, item: StoredRecord | StoredTxnMarker) -> None:
        if isinstance(item, StoredTxnMarker):
            staged = self.pending.pop(item.producer_id, {})
            if item.commit:
                for group_id, offsets in staged.items():
                    current = self.offsets.setdefault(group_id, {})
                    for tp, committed in offsets.items():
                        if tp not in current or current[tp].older_than(committed):
                            current[tp] = committed
            return
        try:
            key = decode_key(item.key)
            if isinstance(key, OffsetCommitKey):
                self._replay_offset(key, item)
            elif isinstance(key, GroupMetadataKey):
                self.groups[key.group] = None if item.value is None else decode_group_metadata_value(item.value)
        except (RecordFormatError, UnicodeDecodeError) as exc:
            log.error("skipping unreadable record at offset %d of __consumer_offsets-%d: %s",
                      item.offset, self.partition, exc)

    def _replay_offset(self, key: OffsetCommitKey, item: StoredRecord) -> None:
        tp = (key.topic, key.partition)
        if item.producer_id >= 0:
            offsets = self.pending.setdefault(item.producer_id, {}).setdefault(key.group, {})
        else:
            offsets = self.offsets.setdefault(key.group, {})
        if item.value is None:
            offsets.pop(tp, None)
            return
        value = decode_offset_commit_value(item.value)
        offsets[tp] = OffsetAndMetadata(
            value.offset, value.leader_epoch, value.metadata, value.commit_timestamp,
            value.expire_timestamp if value.expire_timestamp >= 0 else None, item.offset,
        )

    def finish(self, now_ms: int) -> None:
        self._coordinator._install(self, now_ms)
