"""CreatePartitions: grow a topic (never shrink), validate_only.

The internal topics keep their partition count: a group or transactional id is placed by a
hash modulo that count, so growing them would send every coordinator lookup to the wrong
partition (INVALID_TOPIC_EXCEPTION, as for other writes that would break an internal topic).
"""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from .. import cluster_admin
from .create_topics import MAX_NEW_PARTITIONS_PER_REQUEST, TOO_MANY_PARTITIONS
from .metadata import INTERNAL_TOPICS

API_KEY = 37
VERSIONS = (0, 3)


async def _single_node(broker, topic, info, validate_only: bool) -> None:
    if info is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{topic.name}' does not exist.")
    if topic.count <= info.partition_count:
        raise KafkaError(ErrorCode.invalid_partitions,
                         f"Topic currently has {info.partition_count} partitions, which is higher than or "
                         f"equal to the requested {topic.count}.")
    if topic.assignments is not None:
        if len(topic.assignments) != topic.count - info.partition_count:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             "the number of assignments must match the number of new partitions")
        if any(list(a.broker_ids) != [broker.node_id] for a in topic.assignments):
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"replicas must be exactly [{broker.node_id}] on this single-node cluster")
    if not validate_only:
        await broker.add_partitions_in_worker(topic.name, topic.count)


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    result_type = nested(response_type, "CreatePartitionsTopicResult")
    results = []
    too_many = sum(max(topic.count - (info.partition_count if (info := broker.metadata.topic(topic.name)) else 0), 0)
                   for topic in request.topics) > MAX_NEW_PARTITIONS_PER_REQUEST
    for topic in request.topics:
        error, message = ErrorCode.none, None
        info = broker.metadata.topic(topic.name)
        try:
            if too_many:
                raise KafkaError(ErrorCode.policy_violation, TOO_MANY_PARTITIONS)
            if topic.name in INTERNAL_TOPICS and info is not None:
                raise KafkaError(ErrorCode.invalid_topic_exception,
                                 f"Cannot change the partition count of internal topic {topic.name}")
            if broker.membership is not None:
                await cluster_admin.create_partitions(broker, topic.name, topic.count, topic.assignments,
                                                      validate_only=request.validate_only,
                                                      timeout_ms=int(request.timeout.total_seconds() * 1000))
            else:
                await _single_node(broker, topic, info, request.validate_only)
        except KafkaError as exc:
            error, message = exc.code, exc.message
        results.append(make(result_type, name=topic.name, error_code=error, error_message=message))
    return make(response_type, throttle_time=timedelta(0), results=tuple(results))
