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

from typing import Iterable

from ...errors import ErrorCode
from .api import CLASSIC_GROUP_TYPE, GroupDescription, GroupListing, ListGroupsResult, MemberDescription
from .group import GroupState
from .loading import Loading, PartitionLoader
from .membership import Membership
from .offsets import Offsets

__all__ = ["GroupCoordinator", "PartitionLoader"]


class GroupCoordinator(Membership, Offsets, Loading):
    """Classic consumer groups and their offsets for the `__consumer_offsets` partitions loaded here.

    The parts live in their own modules: `membership` (the rebalance state machine),
    `offsets` (commit, fetch, delete, expiry), `loading` (partition ownership and replay), on
    the shared state and plumbing of `core`; this class adds the admin views and time.
    """

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

