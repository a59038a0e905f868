"""DescribeTopicPartitions (KIP-966): topics and their partitions, paginated by a cursor.

What the Java admin client's describeTopics uses against 3.7+ brokers. Topics come in name
order; a response stops after `response_partition_limit` partitions and names where the
next one starts in `next_cursor`.
"""

import uuid
from datetime import timedelta

from ...errors import ErrorCode
from ...producer_state.authorizer import ResourceType
from ...protocol.build import make, nested
from ..replies import authorized_operations
from .metadata import INTERNAL_TOPICS

API_KEY = 75
VERSIONS = (0, 0)

_NO_ID = uuid.UUID(int=0)


async def handle(ctx, request):
    metadata = ctx.broker.metadata
    response_type = ctx.response_type
    topic_type = nested(response_type, "DescribeTopicPartitionsResponseTopic")
    partition_type = nested(response_type, "DescribeTopicPartitionsResponsePartition")
    cursor_type = nested(response_type, "Cursor")
    names = sorted({t.name for t in request.topics}) if request.topics else sorted(metadata.topic_names())
    cursor = request.cursor
    if cursor is not None:
        names = [name for name in names if name >= cursor.topic_name]
    budget = max(request.response_partition_limit, 1)
    topics, next_cursor = [], None
    for name in names:
        info = metadata.topic(name)
        if info is None:
            topics.append(make(topic_type, error_code=ErrorCode.unknown_topic_or_partition, name=name,
                               topic_id=_NO_ID, is_internal=False, partitions=(),
                               topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name, True)))
            continue
        first = cursor.partition_index if cursor is not None and cursor.topic_name == name else 0
        partitions = []
        for index, state in sorted(info.partitions.items()):
            if index < first:
                continue
            if budget == 0:
                next_cursor = make(cursor_type, topic_name=name, partition_index=index)
                break
            budget -= 1
            leader = metadata.alive_leader(state)
            partitions.append(make(
                partition_type, error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
                partition_index=index, leader_id=leader, leader_epoch=state.leader_epoch,
                replica_nodes=tuple(state.replicas), isr_nodes=tuple(state.isr), eligible_leader_replicas=None,
                last_known_elr=None, offline_replicas=tuple(state.offline_replicas)))
        topics.append(make(topic_type, error_code=ErrorCode.none, name=name, topic_id=info.topic_id,
                           is_internal=name in INTERNAL_TOPICS, partitions=tuple(partitions),
                           topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name, True)))
        if next_cursor is not None:
            break
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics), next_cursor=next_cursor)
