"""Taking over and giving up `__consumer_offsets` partitions: replaying one into groups."""

from __future__ import annotations

import logging

from ...errors import ErrorCode
from ...records.batch import CONTROL_BIT, TRANSACTIONAL_BIT
from ...records.control import ABORT, COMMIT, control_type
from ...records.scan import scan_batches
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
        """Serve the groups `loader` built: the only step of a load that touches the
        coordinator's state (a dict merge, and the heartbeats of members the log holds)."""
        with self._operation(now_ms):
            self._groups.update(loader.built)
            for producer_id, staged in loader.pending.items():
                self._producer_groups.setdefault(producer_id, set()).update(g for g, o in staged.items() if o)
            for group in loader.with_members:
                for member in group.members.values():
                    self._schedule_heartbeat(group, member)
            self._loading.discard(loader.partition)
            self._owned.add(loader.partition)
            log.debug("loaded %d groups from __consumer_offsets-%d", len(loader.built), loader.partition)

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

    Records are replayed by key, as bytes: a later record of a key replaces the earlier one
    there and then, and only each key's last record is decoded, when the load finishes (a
    commit storm writes the same few keys over and over). Record sets straight from the log
    (`replay` of bytes) are walked without building an object per field.
    Transactional offset commits are held per producer until that producer's marker: a
    COMMIT applies them (unless a later record in the log overrode the offset), an ABORT
    drops them, and what is still open at the end stays pending in the group. A key whose
    last record does not parse is skipped with one error line.
    """

    def __init__(self, coordinator: Loading, partition: int):
        self._coordinator = coordinator
        self.partition = partition
        # key -> (log offset, value or None) of its last record
        self._latest: dict[bytes, tuple[int, bytes | None]] = {}
        self._staged: dict[int, dict[bytes, tuple[int, bytes]]] = {}  # producer id -> its open commits
        self.groups: dict[str, GroupMetadataValue | None] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        self._prepared = False
        self.built: dict[str, Group] = {}  # the groups, once `prepare` made them
        self.with_members: list[Group] = []  # built groups whose members must heartbeat

    def replay(self, item: StoredRecord | StoredTxnMarker | bytes) -> None:
        """One record or marker, or a record set of whole batches as the log holds them."""
        if isinstance(item, (bytes, bytearray, memoryview)):
            self._replay_record_set(bytes(item))
        elif isinstance(item, StoredTxnMarker):
            self._end_txn(item.producer_id, item.commit)
        else:
            self._replay_record(item.offset, item.key, item.value, item.producer_id)

    def _replay_record_set(self, data: bytes) -> None:
        latest = self._latest
        # Plain batches (a commit storm's) go straight into `latest`; the rest come here.
        for _, _, attributes, producer_id, records in scan_batches(data, plain_into=latest):
            if attributes & CONTROL_BIT:
                kind = control_type(records[0][1]) if records else None
                if kind in (ABORT, COMMIT):
                    self._end_txn(producer_id, kind == COMMIT)
            elif attributes & TRANSACTIONAL_BIT:
                for offset, key, value in records:
                    if key is not None:
                        self._replay_record(offset, key, value, producer_id)
            else:  # compressed plain batches
                for offset, key, value in records:
                    if key is not None:
                        latest[key] = (offset, value)

    def _replay_record(self, offset: int, key: bytes, value: bytes | None, producer_id: int) -> None:
        if producer_id >= 0 and _is_offset_commit_key(key):
            staged = self._staged.setdefault(producer_id, {})
            staged.pop(key, None)  # a staged tombstone just drops the staged commit
            if value is not None:
                staged[key] = (offset, value)
        else:
            self._latest[key] = (offset, value)

    def _end_txn(self, producer_id: int, commit: bool) -> None:
        staged = self._staged.pop(producer_id, {})
        if commit:
            latest = self._latest
            for key, (offset, value) in staged.items():
                current = latest.get(key)
                if current is None or current[1] is None or current[0] < offset:
                    latest[key] = (offset, value)

    def prepare(self, now_ms: int) -> None:
        """Decode each key's last record into groups and offsets and build the groups: the
        load's own state only, so the runtime runs it off the event loop (there, 100,000
        offsets took 1.1-1.2 s of CPU to decode, 100,000 separate groups 0.95-1.13 s to build
        and install)."""
        if not self._prepared:
            self._prepared = True
            self._decode_all()
            self._build(now_ms)

    def _decode_all(self) -> None:
        # In log order, so two spellings of one key (OffsetCommitKey v0 and v1) end as the log says.
        for key, (offset, value) in sorted(self._latest.items(), key=_log_order):
            self._decode(key, offset, value, self.offsets)
        for producer_id, staged in self._staged.items():
            pending: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
            for key, (offset, value) in sorted(staged.items(), key=_log_order):
                self._decode(key, offset, value, pending)
            self.pending[producer_id] = pending
        self._latest.clear()
        self._staged.clear()

    def _build(self, now_ms: int) -> None:
        group_ids = ({g for g, value in self.groups.items() if value is not None}
                     | {g for g, offsets in self.offsets.items() if offsets}
                     | {g for staged in self.pending.values() for g, offsets in staged.items() if offsets})
        for group_id in group_ids:
            value = self.groups.get(group_id)
            group = (Group(group_id, self.partition, now_ms) if value is None
                     else _group_from_value(group_id, self.partition, value, now_ms))
            group.offsets = self.offsets.get(group_id, {})
            for producer_id, staged in self.pending.items():
                if staged.get(group_id):
                    group.pending_txn_offsets[producer_id] = staged[group_id]
            self.built[group_id] = group
            if group.members:
                self.with_members.append(group)

    def finish(self, now_ms: int) -> None:
        """Install what was replayed (preparing it first unless `prepare` ran): its groups are
        served from now on."""
        self.prepare(now_ms)
        self._coordinator._install(self, now_ms)

    def _decode(self, key: bytes, offset: int, value: bytes | None,
                offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]]) -> None:
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetCommitKey):
                group_offsets = offsets.setdefault(decoded.group, {})
                tp = (decoded.topic, decoded.partition)
                if value is None:
                    group_offsets.pop(tp, None)
                    return
                commit = decode_offset_commit_value(value)
                group_offsets[tp] = OffsetAndMetadata(
                    commit.offset, commit.leader_epoch, commit.metadata, commit.commit_timestamp,
                    commit.expire_timestamp if commit.expire_timestamp >= 0 else None, offset,
                )
            elif isinstance(decoded, GroupMetadataKey):
                self.groups[decoded.group] = None if value is None else decode_group_metadata_value(value)
        except (RecordFormatError, UnicodeDecodeError) as exc:
            log.error("skipping unreadable record at offset %d of __consumer_offsets-%d: %s",
                      offset, self.partition, exc)


def _group_from_value(group_id: str, partition: int, value: GroupMetadataValue, now_ms: int) -> Group:
    """A group as last written; one with members resumes Stable and its members must heartbeat."""
    group = Group(group_id, partition, now_ms, GroupState.STABLE if value.members else GroupState.EMPTY)
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


def _log_order(item: tuple[bytes, tuple[int, bytes | None]]) -> int:
    return item[1][0]


def _is_offset_commit_key(key: bytes) -> bool:
    return len(key) >= 2 and key[0] == 0 and key[1] in (0, 1)
