"""Taking over and giving up `__consumer_offsets` partitions: replaying one into groups."""

from __future__ import annotations

import logging

from ...errors import ErrorCode
from .api import JoinResult, StoredRecord, StoredTxnMarker, SyncResult
from .core import CoordinatorCore
from .group import Group, GroupState, Member, OffsetAndMetadata, TopicPartition
from .records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)

log = logging.getLogger("ottla.group")


class Loading(CoordinatorCore):
    """Partition ownership: load (in steps, through a `PartitionLoader`) and unload."""

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


class PartitionLoader:
    """Replays one `__consumer_offsets` partition into groups, the way Kafka loads it.

    Transactional offset commits are held per producer until that producer's marker: a
    COMMIT applies them (unless a later record in the log overrode the offset), an ABORT
    drops them, and what is still open at the end stays pending in the group.
    """

    def __init__(self, coordinator: Loading, partition: int):
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
