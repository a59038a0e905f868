"""What every part of the group coordinator shares: its state, and the plumbing of a call.

Each call runs at an explicit time (`_operation`); replies and store appends are queued while
it mutates state and run after it (`_defer`, `_flush`), so a callback or a synchronously
durable store never sees half an update.
"""

from __future__ import annotations

import logging
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ...config import BrokerConfig
from ...errors import ErrorCode
from ..partitioning import partition_for
from .api import JoinResult, OffsetsStore, OnDurable, SyncResult
from .group import Group, Member
from .timers import Timers

log = logging.getLogger("ottla.group")


def store_error(error: ErrorCode, for_offsets: bool) -> ErrorCode:
    """Kafka's translation of a failed offsets-topic append into what group clients understand."""
    if error in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                 ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (ErrorCode.record_list_too_large, ErrorCode.message_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.invalid_commit_offset_size if for_offsets else ErrorCode.unknown_server_error
    return error


class CoordinatorCore:
    """The state the membership, offsets and loading parts of `GroupCoordinator` work on."""

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
        self._timers = Timers(on_deadline)
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
