"""OffsetDelete: drop a group's offsets for partitions it no longer consumes (KIP-496)."""

from datetime import timedelta

from ...coordinator.group import OffsetDeleteResult
from ..replies import authorized, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 47
VERSIONS = (0, 0)


async def handle(ctx, request):
    broker = ctx.broker
    readable = {t.name for t in request.topics if authorized(ctx, Operation.READ, ResourceType.TOPIC, t.name)}
    partitions = [(t.name, p.partition_index) for t in request.topics if t.name in readable for p in t.partitions
                  if broker.metadata.partition(t.name, p.partition_index) is not None]
    if authorized(ctx, Operation.DELETE, ResourceType.GROUP, request.group_id):
        future, respond = reply_future()
        broker.groups.coordinator.delete_offsets(group_id=request.group_id, partitions=partitions,
                                                 now_ms=now_ms(), on_complete=respond)
        result = await future
    else:
        result = OffsetDeleteResult(ErrorCode.group_authorization_failed)
    response_type = ctx.response_type
    if result.error != ErrorCode.none:
        return make(response_type, error_code=result.error, throttle_time=timedelta(0), topics=())
    topic_type = nested(response_type, "OffsetDeleteResponseTopic")
    partition_type = nested(response_type, "OffsetDeleteResponsePartition")
    return make(response_type, error_code=ErrorCode.none, throttle_time=timedelta(0), topics=tuple(
        make(topic_type, name=t.name, partitions=tuple(
            make(partition_type, partition_index=p.partition_index,
                 error_code=result.partitions.get((t.name, p.partition_index),
                                                  ErrorCode.unknown_topic_or_partition if t.name in readable
                                                  else ErrorCode.topic_authorization_failed))
            for p in t.partitions))
        for t in request.topics))
