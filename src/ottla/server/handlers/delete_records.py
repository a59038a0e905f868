"""DeleteRecords: move partitions' log start offset forward (all versions, 0-2).

As Kafka: offset -1 means the high watermark, an offset past the high watermark is
OFFSET_OUT_OF_RANGE, internal topics are INVALID_TOPIC_EXCEPTION and topics whose
cleanup.policy lacks "delete" are POLICY_VIOLATION. The answer's low watermark is the new
log start offset, which ListOffsets earliest and Fetch then follow; segments wholly below
it are deleted at once.
"""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ..steps import Steps, producer_state_ready
from .metadata import INTERNAL_TOPICS

API_KEY = 21
VERSIONS = (0, 2)

_TO_HIGH_WATERMARK = -1


def _delete(log, topic: str, offset: int) -> int:
    if topic in INTERNAL_TOPICS:
        raise KafkaError(ErrorCode.invalid_topic_exception, f"cannot delete records of internal topic {topic}")
    if "delete" not in log.config["cleanup.policy"]:
        raise KafkaError(ErrorCode.policy_violation,
                         f"records of {topic} cannot be deleted: its cleanup.policy is compact")
    if offset == _TO_HIGH_WATERMARK:
        offset = log.high_watermark
    return log.delete_records_before(offset)


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "DeleteRecordsTopicResult")
    partition_type = nested(response_type, "DeleteRecordsPartitionResult")
    topics = []
    steps = Steps()  # 200,000 partitions in one request held the loop 0.7 s of CPU
    for topic in request.topics:
        await steps.one()
        partitions = []
        for wanted in topic.partitions:
            await steps.one()
            error, low_watermark = ErrorCode.none, -1
            try:
                partition = ctx.broker.replicas.leader_partition(topic.name, wanted.partition_index)
                if not partition.log.producer_state_ready:  # the log start moves it: loaded in steps
                    await producer_state_ready(partition.log)
                    partition = ctx.broker.replicas.leader_partition(topic.name, wanted.partition_index)
                low_watermark = _delete(partition.log, topic.name, wanted.offset)
            except KafkaError as exc:
                error = exc.code
            partitions.append(make(partition_type, partition_index=wanted.partition_index,
                                   low_watermark=low_watermark, error_code=error))
        topics.append(make(topic_type, name=topic.name, partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics))
