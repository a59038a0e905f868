"""OffsetCommit: answered per partition once the offsets are durable in `__consumer_offsets`."""

import asyncio
from datetime import timedelta

from ...coordinator.group import OffsetCommit
from ..replies import authorized, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 8
# v0-v1 were removed in Kafka 4.0 (KIP-896); Kafka 3.9 kept v0 commits in ZooKeeper, Ottla
# keeps them with the rest (v0 has no generation or member: a simple, group-less commit).
# v2-v4 carry a retention time; v6 the leader epoch; v7 static members; v9
# GROUP_ID_NOT_FOUND for unknown groups; v10 topic ids.
VERSIONS = (0, 10)

_MS = timedelta(milliseconds=1)
_YIELD_EVERY = 256  # partitions checked or answered per step


def topic_name(broker, topic, by_id: bool) -> str | None:
    """The topic's name, resolving v10+ topic ids; None for an id no topic has."""
    if not by_id:
        return topic.name
    info = broker.metadata.topic_by_id(topic.topic_id)
    return info.name if info is not None else None


def _topic_error(ctx, name: str | None, partition: int, by_id: bool) -> ErrorCode | None:
    """Why a partition's offset cannot be committed before the group is even asked, if it cannot."""
    if name is None:
        return ErrorCode.unknown_topic_id if by_id else ErrorCode.unknown_topic_or_partition
    if not authorized(ctx, Operation.READ, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed
    if ctx.broker.metadata.partition(name, partition) is None:
        return ErrorCode.unknown_topic_or_partition
    return None


async def handle(ctx, request):
    broker = ctx.broker
    by_id = ctx.api_version >= 10
    topics = [(topic, topic_name(broker, topic, by_id)) for topic in request.topics]
    group_allowed = authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id)
    errors: dict[tuple, ErrorCode] = {}
    coordinator = broker.groups.coordinator
    retention = getattr(request, "retention_time", None)
    now = now_ms()
    # The records are made here, between yields; the coordinator then takes the commit in one step.
    prepared = coordinator.prepare_commit(request.group_id, now, -1 if retention is None else retention // _MS)
    checked = 0
    for topic, name in topics:
        for p in topic.partitions:
            checked += 1
            if checked % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a commit naming thousands of partitions: others go between
            error = ErrorCode.group_authorization_failed if not group_allowed else \
                _topic_error(ctx, name, p.partition_index, by_id)
            if error is not None:
                errors[(name, p.partition_index)] = error
            else:
                prepared.add((name, p.partition_index), OffsetCommit(
                    p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata))
    if prepared.staged or prepared.refused:
        future, respond = reply_future()
        coordinator.commit_prepared(
            group_id=request.group_id,
            member_id=getattr(request, "member_id", ""),
            group_instance_id=getattr(request, "group_instance_id", None),
            generation_id=getattr(request, "generation_id_or_member_epoch", -1),
            prepared=prepared,
            now_ms=now,
            on_complete=respond,
        )
        errors.update(await future)

    response_type = ctx.response_type
    topic_type = nested(response_type, "OffsetCommitResponseTopic")
    partition_type = nested(response_type, "OffsetCommitResponsePartition")
    response_topics = []
    answered = 0
    for topic, name in topics:
        partitions = []
        for p in topic.partitions:
            answered += 1
            if answered % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            error = errors[(name, p.partition_index)]
            if error == ErrorCode.group_id_not_found and ctx.api_version < 9:
                error = ErrorCode.illegal_generation
            partitions.append(make(partition_type, partition_index=p.partition_index, error_code=error))
        response_topics.append(make(topic_type, name=getattr(topic, "name", None),
                                    topic_id=getattr(topic, "topic_id", None), partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(response_topics))
