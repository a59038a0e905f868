"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup: the classic protocol's rebalance state machine."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ...errors import ErrorCode
from .api import JoinResult, LeaveResult, LeavingMember, SyncResult
from .core import CoordinatorCore, store_error
from .group import Group, GroupState, Member
from .records import GroupMetadataKey, GroupMetadataValue, MemberMetadataValue, encode_group_metadata_value, encode_key
from .timers import DelayedJoin

log = logging.getLogger("ottla.group")

# A joining member cannot heartbeat until its first JoinGroup is answered, and a client that
# gave up on a long rebalance retries with a new request; Kafka drops such members after 5 min.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


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


class Membership(CoordinatorCore):
    """Members joining, syncing, heartbeating and leaving; the group's generations."""

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
                store_error(error, for_offsets=False), "", group.generation_id, group.protocol_type,
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
            delayed = DelayedJoin(True, delay, max(group.rebalance_timeout_ms - delay, 0))
        else:
            delay = group.rebalance_timeout_ms
            delayed = DelayedJoin(False)
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

    def _on_join_expired(self, group: Group, _: None, delayed: DelayedJoin) -> None:
        if delayed.initial and group.new_member_added and delayed.remaining_ms:
            group.new_member_added = False
            delay = min(self.config["group.initial.rebalance.delay.ms"], delayed.remaining_ms)
            remaining = max(delayed.remaining_ms - delayed.delay_ms, 0)
            self._timers.schedule(("join", group, None), self._now + delay, DelayedJoin(True, delay, remaining))
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
            self._timers.schedule(("join", group, None), self._now + group.rebalance_timeout_ms, DelayedJoin(False))
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
        self._append(group.partition, [record], lambda error, _: on_done(store_error(error, for_offsets=False)))

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

