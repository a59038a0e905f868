"""DescribeProducers (KIP-664): the producer ids a partition remembers, with epoch and sequence.

Errors follow Kafka's KafkaApis: an illegal topic name is INVALID_TOPIC_EXCEPTION, a topic
the principal may not read is TOPIC_AUTHORIZATION_FAILED, an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION, each reported on every partition asked for.
"""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...log.manager import validate_topic_name
from ...producer_state.authorizer import Operation, Resource, ResourceType
from ...protocol.build import make, nested
from ..steps import producer_state_ready

API_KEY = 61
VERSIONS = (0, 0)

_UNKNOWN = "This server does not host this topic-partition."


def _topic_error(ctx, name: str) -> tuple[ErrorCode, str] | None:
    try:
        validate_topic_name(name)
    except KafkaError as exc:
        return exc.code, exc.message
    if not ctx.broker.authorizer.authorize(ctx.principal, Operation.READ, Resource(ResourceType.TOPIC, name)):
        return ErrorCode.topic_authorization_failed, f"{ctx.principal} may not read topic {name}"
    if not ctx.broker.metadata.has_topic(name):
        return ErrorCode.unknown_topic_or_partition, _UNKNOWN
    return None


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "TopicResponse")
    partition_type = nested(response_type, "PartitionResponse")
    state_type = nested(response_type, "ProducerState")
    topics = []
    for topic in request.topics:
        error = _topic_error(ctx, topic.name)
        partitions = []
        for index in topic.partition_indexes:
            found = error
            if found is None:
                try:
                    log = ctx.broker.replicas.leader_partition(topic.name, index).log
                    if not log.producer_state_ready:  # loaded on first use, in steps
                        await producer_state_ready(log)
                        log = ctx.broker.replicas.leader_partition(topic.name, index).log
                except KafkaError as exc:
                    found = exc.code, exc.message or _UNKNOWN
            if found is not None:
                code, message = found
                partitions.append(make(partition_type, partition_index=index, error_code=code,
                                       error_message=message, active_producers=()))
                continue
            producers = tuple(
                make(state_type, producer_id=p.producer_id, producer_epoch=p.producer_epoch,
                     last_sequence=p.last_sequence, last_timestamp=p.last_timestamp,
                     coordinator_epoch=p.coordinator_epoch, current_txn_start_offset=p.current_txn_start_offset)
                for p in log.producer_state.active_producers()
            )
            partitions.append(make(partition_type, partition_index=index, error_code=ErrorCode.none,
                                   error_message=None, active_producers=producers))
        topics.append(make(topic_type, name=topic.name, partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics))
