"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3) and by timestamp.

Each answer carries the leader epoch of the offset it names (the current epoch for latest),
and a request naming another current leader epoch is fenced (KIP-320)."""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ..leader_epochs import leader_epoch_error, partition_leader_epoch

API_KEY = 2
VERSIONS = (1, 8)

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
READ_COMMITTED = 1


def _lookup(log, timestamp: int, read_committed: bool) -> tuple[int, int]:
    """(offset, timestamp) as Kafka answers; (-1, -1) when no record has a timestamp that late."""
    if timestamp == EARLIEST:
        return log.log_start_offset, -1
    if timestamp == LATEST:
        return (log.last_stable_offset if read_committed else log.high_watermark), -1
    if timestamp == MAX_TIMESTAMP:
        found = log.max_timestamp_offset()
    else:
        found = log.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)


def _epoch_of(broker, topic: str, partition: int, log, timestamp: int, offset: int) -> int:
    """Kafka's answer: the current epoch for latest, else the epoch whose leader wrote `offset`
    (-1 when no offset was found)."""
    if offset < 0:
        return -1
    current = partition_leader_epoch(broker, topic, partition)
    if timestamp == LATEST:
        return current
    epoch = log.leader_epoch_cache.epoch_for_offset(offset)
    return current if epoch is None else epoch  # nothing written since this leader's election


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "ListOffsetsTopicResponse")
    partition_type = nested(response_type, "ListOffsetsPartitionResponse")
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            log = ctx.broker.find_log(topic.name, wanted.partition_index)
            error, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
            if log is None:
                error = ErrorCode.unknown_topic_or_partition
            elif wanted.timestamp == MAX_TIMESTAMP and ctx.api_version < 7:
                error = ErrorCode.unsupported_version
            else:
                error = leader_epoch_error(ctx.broker, topic.name, wanted.partition_index,
                                           getattr(wanted, "current_leader_epoch", -1))
            if error is ErrorCode.none:
                try:
                    offset, timestamp = _lookup(log, wanted.timestamp, read_committed)
                except KafkaError as exc:
                    error = exc.code
                else:
                    epoch = _epoch_of(ctx.broker, topic.name, wanted.partition_index, log, wanted.timestamp, offset)
            partitions.append(make(partition_type, partition_index=wanted.partition_index, error_code=error,
                                   timestamp=timestamp, offset=offset, leader_epoch=epoch))
        topics.append(make(topic_type, name=topic.name, partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics))
