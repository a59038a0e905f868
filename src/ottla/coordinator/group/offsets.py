"""OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete, DeleteGroups and offset expiry."""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping, Sequence

from ...errors import ErrorCode
from .api import NO_OFFSET, FetchedOffset, OffsetCommit, OffsetDeleteResult, OffsetFetchResult
from .core import CoordinatorCore, store_error
from .group import CONSUMER_PROTOCOL_TYPE, Group, GroupState, OffsetAndMetadata, TopicPartition
from .records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_key,
    encode_offset_commit_value,
)

log = logging.getLogger("ottla.group")


def _java_length(text: str) -> int:
    """String.length() in Java counts UTF-16 code units; offset.metadata.max.bytes is checked on it."""
    return len(text.encode("utf-16-le")) // 2


class PreparedCommit:
    """A commit's values and `__consumer_offsets` records, made one partition at a time before
    the coordinator takes the commit in one step (validation, then one batch, as Kafka writes
    a commit atomically): making them costs about 5 us a partition, which for a commit naming
    12,000 partitions held the event loop for 73 ms when it happened inside that step. The
    OffsetCommit handler adds partitions between its yields. A partition added twice keeps
    the last value, as a request naming it twice does."""

    __slots__ = ("group_id", "now_ms", "expire", "max_metadata", "staged", "records", "refused")

    def __init__(self, group_id: str, now_ms: int, expire: int | None, max_metadata: int):
        self.group_id, self.now_ms, self.expire, self.max_metadata = group_id, now_ms, expire, max_metadata
        self.staged: dict[TopicPartition, OffsetAndMetadata] = {}
        self.records: dict[TopicPartition, tuple[bytes, bytes]] = {}  # in the order of `staged`
        self.refused: dict[TopicPartition, ErrorCode] = {}

    def add(self, tp: TopicPartition, commit: OffsetCommit) -> None:
        for earlier in (self.staged, self.records, self.refused):
            earlier.pop(tp, None)
        metadata = commit.metadata or ""
        if _java_length(metadata) > self.max_metadata:
            self.refused[tp] = ErrorCode.offset_metadata_too_large
            return
        o = OffsetAndMetadata(commit.offset, commit.leader_epoch, metadata, self.now_ms, self.expire)
        self.staged[tp] = o
        self.records[tp] = (encode_key(OffsetCommitKey(self.group_id, tp[0], tp[1])), encode_offset_commit_value(
            OffsetCommitValue(o.offset, o.metadata, o.commit_timestamp, o.leader_epoch,
                              o.expire_timestamp if o.expire_timestamp is not None else -1)))

    def partitions(self) -> list[TopicPartition]:
        return [*self.staged, *self.refused]


class Offsets(CoordinatorCore):
    """Committed offsets: stored, fetched, deleted, and expired after offsets.retention.minutes."""

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
        """OffsetCommit; answered per partition once the records are durable (see
        `commit_prepared`, which this is with the commit prepared in one go)."""
        prepared = self.prepare_commit(group_id, now_ms, retention_ms)
        for tp, commit in offsets.items():
            prepared.add(tp, commit)
        self.commit_prepared(group_id=group_id, member_id=member_id, group_instance_id=group_instance_id,
                             generation_id=generation_id, prepared=prepared, now_ms=now_ms, on_complete=on_complete)

    def prepare_commit(self, group_id: str, now_ms: int, retention_ms: int = -1) -> PreparedCommit:
        """An empty commit of `group_id` at `now_ms`, to `add` partitions to, a few at a time
        if the caller likes, before `commit_prepared` takes it in one step.
        `retention_ms` is OffsetCommit v2-v4's retention_time_ms (-1: broker default)."""
        now = max(self._now, now_ms)
        return PreparedCommit(group_id, now, None if retention_ms == -1 else now + retention_ms,
                              self.config["offset.metadata.max.bytes"])

    def commit_prepared(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        prepared: PreparedCommit,
        now_ms: int,
        on_complete: Callable[[dict[TopicPartition, ErrorCode]], None],
    ) -> None:
        """OffsetCommit; answered per partition once the records are durable.

        Generation -1 with no member id is a consumer not using group management: allowed
        while the group is Empty (and creates it). An unknown group with a generation gets
        GROUP_ID_NOT_FOUND, which OffsetCommit before v9 reports as ILLEGAL_GENERATION.
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
                self._reply(on_complete, dict.fromkeys(prepared.partitions(), error))
                return
            assert group is not None
            if group.is_in(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                self._schedule_heartbeat(group, group.members[member_id])
            self._store_offsets(group, prepared, on_complete)

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
            prepared = self.prepare_commit(group_id, now_ms)
            for tp, commit in offsets.items():
                prepared.add(tp, commit)
            self._store_offsets(group, prepared, on_complete, producer_id, producer_epoch)

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

    def _store_offsets(self, group: Group, prepared: PreparedCommit,
                       on_complete: Callable[[dict[TopicPartition, ErrorCode]], None],
                       producer_id: int = -1, producer_epoch: int = -1) -> None:
        results: dict[TopicPartition, ErrorCode] = dict(prepared.refused)
        staged = prepared.staged
        if not staged:
            self._reply(on_complete, results)
            return
        transactional = producer_id >= 0
        if transactional:
            group.prepare_txn_offset_commit(producer_id, staged)
            self._producer_groups.setdefault(producer_id, set()).add(group.group_id)
        else:
            group.pending_offset_commits.update(staged.keys())

        def durable(error: ErrorCode, base_offset: int) -> None:
            if not group.is_in(GroupState.DEAD):
                for i, (tp, o) in enumerate(staged.items()):
                    if error != ErrorCode.none:
                        if transactional:
                            group.fail_pending_txn_offset_commit(producer_id, tp)
                        else:
                            group.fail_pending_offset_commit(tp)
                    elif transactional:
                        group.on_txn_offset_commit_append(producer_id, tp, o.logged_at(base_offset + i))
                    else:
                        group.on_offset_commit_append(tp, o.logged_at(base_offset + i))
            results.update(dict.fromkeys(staged, store_error(error, for_offsets=True)))
            self._reply(on_complete, results)

        self._append(group.partition, list(prepared.records.values()), durable, producer_id, producer_epoch)

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
            mapped = store_error(error, for_offsets=False)
            if mapped != ErrorCode.none:
                log.warning("failed to write tombstones for group %s: %s", group.group_id, mapped.name)
            if on_done is not None:
                on_done(mapped)

        if records:
            self._append(group.partition, records, durable)
        elif on_done is not None:
            on_done(ErrorCode.none)

    def _expire_offsets(self) -> None:
        retention_ms = self.config["offsets.retention.minutes"] * 60 * 1000
        for group in list(self._groups.values()):
            expired = group.remove_expired_offsets(self._now, retention_ms)
            if expired or (group.is_in(GroupState.EMPTY) and not group.has_offsets):
                self._cleanup_group_metadata(group, expired)

