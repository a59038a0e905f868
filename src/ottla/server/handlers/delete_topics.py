"""DeleteTopics by name (all versions) or topic id (v6+).

The internal topics are refused with INVALID_TOPIC_EXCEPTION, the code Kafka gives for any
write that would destroy an internal topic's data (DeleteRecords, Produce); kafka-topics.sh
refuses to delete them too. Without `__consumer_offsets` every committed offset is gone, and
without `__transaction_state` no transactional producer can start.
"""

import asyncio
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from .. import cluster_admin
from ..clock import now_ms
from .metadata import INTERNAL_TOPICS

API_KEY = 20
VERSIONS = (0, 6)  # v0 removed in Kafka 4.0 (KIP-896)


def _targets(ctx, request):
    """(name, topic_id) pairs asked for; v6 names topics by name or id."""
    if ctx.api_version >= 6:
        return [(t.name, t.topic_id) for t in request.topics]
    return [(name, None) for name in request.topic_names]


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    result_type = nested(response_type, "DeletableTopicResult")
    results = []
    for name, topic_id in _targets(ctx, request):
        error, message = ErrorCode.none, None
        if name is None and topic_id is not None:
            info = broker.metadata.topic_by_id(topic_id)
            name = info.name if info else None
            if name is None:
                error = ErrorCode.unknown_topic_id
        info = broker.metadata.topic(name) if name is not None else None
        if error == ErrorCode.none:
            if not broker.config["delete.topic.enable"]:
                error = ErrorCode.topic_deletion_disabled
            elif info is None:
                error = ErrorCode.unknown_topic_or_partition
            elif name in INTERNAL_TOPICS:
                topic_id = info.topic_id
                error, message = ErrorCode.invalid_topic_exception, f"Cannot delete internal topic {name}"
            else:
                topic_id = info.topic_id
                try:
                    if broker.membership is not None:
                        await cluster_admin.delete_topic(broker, name, timeout_ms=int(request.timeout.total_seconds() * 1000))
                    else:
                        broker.delete_topic(name)
                        broker.groups.coordinator.on_topics_deleted([name], now_ms())
                        await asyncio.sleep(0)  # one topic per step: other connections go between
                except KafkaError as exc:
                    error, message = exc.code, exc.message
        results.append(make(result_type, name=name, topic_id=topic_id, error_code=error, error_message=message))
    return make(response_type, throttle_time=timedelta(0), responses=tuple(results))
