"""OffsetFetch: committed offsets of one group (v1-v7) or several (v8+)."""

import asyncio
from datetime import timedelta

from ...coordinator.group import OffsetFetchResult
from ..replies import authorized
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from .offset_commit import topic_name

API_KEY = 9
# v0 (removed in Kafka 4.0, KIP-896) reads what v0 commits wrote, like v1. v2: all
# partitions (null topics) and a group error; v7: require_stable (KIP-447); v8: several
# groups; v10: topic ids.
VERSIONS = (0, 10)
_YIELD_EVERY = 256  # partitions answered per step (all 2,000 offsets of a group held the loop 42 ms)


async def _fetch_group(ctx, group_id: str, requested, require_stable: bool, types: tuple) -> tuple[ErrorCode, tuple]:
    """(group error, response topics) for one group; `requested` None asks for every partition.
    The coordinator answers at one instant; building the answer yields between partitions."""
    broker = ctx.broker
    topic_type, partition_type = types
    by_id = ctx.api_version >= 10

    allowed: dict[str, bool] = {}  # asked once per topic, not once per partition

    def visible(name: str | None) -> bool:
        if name is None:
            return False
        if name not in allowed:
            allowed[name] = authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)
        return allowed[name]

    wanted = None if requested is None else [(topic, topic_name(broker, topic, by_id)) for topic in requested]
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        result = OffsetFetchResult(ErrorCode.group_authorization_failed, {})
    else:
        partitions = None if wanted is None else [
            (name, index) for topic, name in wanted if visible(name) for index in topic.partition_indexes]
        result = broker.groups.coordinator.fetch_offsets(group_id=group_id, partitions=partitions,
                                                         require_stable=require_stable)
    if result.error != ErrorCode.none and ctx.api_version >= 2:
        return result.error, ()

    answered = 0

    async def answer(name, index):
        nonlocal answered
        answered += 1
        if answered % _YIELD_EVERY == 0:
            await asyncio.sleep(0)  # every offset of a large group: other connections go between
        error = result.error  # v1 has no group error: each partition carries it
        if error == ErrorCode.none and name is None:
            error = ErrorCode.unknown_topic_id
        elif error == ErrorCode.none and not visible(name):
            error = ErrorCode.topic_authorization_failed
        if error != ErrorCode.none:
            return make(partition_type, partition_index=index, committed_offset=-1, committed_leader_epoch=-1,
                        metadata="", error_code=error)
        fetched = result.offsets[(name, index)]
        return make(partition_type, partition_index=index, committed_offset=fetched.offset,
                    committed_leader_epoch=fetched.leader_epoch, metadata=fetched.metadata,
                    error_code=fetched.error)

    topics = []
    if wanted is not None:
        for topic, name in wanted:
            topics.append(make(topic_type, name=getattr(topic, "name", None), topic_id=getattr(topic, "topic_id", None),
                               partitions=tuple([await answer(name, index) for index in topic.partition_indexes])))
    else:
        by_topic: dict[str, list[int]] = {}
        for count, (name, index) in enumerate(result.offsets, 1):
            if count % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if visible(name):
                by_topic.setdefault(name, []).append(index)
        for name, indexes in by_topic.items():
            info = broker.metadata.topic(name)
            if by_id and info is None:
                continue  # a deleted topic has no id to report it under
            topics.append(make(topic_type, name=name, topic_id=info.topic_id if info else None,
                               partitions=tuple([await answer(name, index) for index in sorted(indexes)])))
    return ErrorCode.none, tuple(topics)


async def handle(ctx, request):
    response_type = ctx.response_type
    require_stable = getattr(request, "require_stable", False)
    if ctx.api_version >= 8:
        group_type = nested(response_type, "OffsetFetchResponseGroup")
        types = (nested(response_type, "OffsetFetchResponseTopics"), nested(response_type, "OffsetFetchResponsePartitions"))
        groups = []
        for group in request.groups:
            error, topics = await _fetch_group(ctx, group.group_id, group.topics, require_stable, types)
            groups.append(make(group_type, group_id=group.group_id, topics=topics, error_code=error))
        return make(response_type, throttle_time=timedelta(0), groups=tuple(groups))
    types = (nested(response_type, "OffsetFetchResponseTopic"), nested(response_type, "OffsetFetchResponsePartition"))
    error, topics = await _fetch_group(ctx, request.group_id, request.topics, require_stable, types)
    return make(response_type, throttle_time=timedelta(0), topics=topics, error_code=error)
