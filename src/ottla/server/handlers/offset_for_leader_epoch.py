"""OffsetsForLeaderEpoch: where a leader epoch ends on this partition's leader (KIP-101,
KIP-279), for followers deciding where to truncate and for consumers checking for truncation
after a leader change (KIP-320).

As in Kafka, `replica_id` only says who asks (a follower's id, -1 for a consumer, -2 for a
debugging tool); the answer is the leader's either way. v0-1 (followers of Kafka 2.0 and
older) carry neither `replica_id` nor `current_leader_epoch`: Kafka 3.9 served them without
an epoch check, and v0's answer has no leader epoch.
"""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ...replication.epochs import epoch_end_offset
from ..leader_epochs import leader_partition_at
from ..steps import Steps

API_KEY = 23
VERSIONS = (0, 4)


def _answer(broker, topic: str, wanted) -> tuple[ErrorCode, int, int]:
    """(error, leader epoch, end offset); an epoch the log cannot place answers (-1, -1)."""
    try:
        partition = leader_partition_at(broker, topic, wanted.partition,
                                        getattr(wanted, "current_leader_epoch", -1))
    except KafkaError as exc:
        return exc.code, -1, -1
    found = epoch_end_offset(partition.log, partition.leader_epoch, wanted.leader_epoch)
    return ErrorCode.none, found.leader_epoch, found.end_offset


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "OffsetForLeaderTopicResult")
    # kio names the partition class EpochEndOffset; Kafka 3.9's v0-1 schema, OffsetForLeaderPartitionResult.
    partition_type = (nested(response_type, "EpochEndOffset")
                      or nested(response_type, "OffsetForLeaderPartitionResult"))
    topics = []
    steps = Steps()  # 200,000 partitions in one request held the loop 0.9 s of CPU
    for topic in request.topics:
        await steps.one()
        partitions = []
        for wanted in topic.partitions:
            await steps.one()
            error, epoch, end_offset = _answer(ctx.broker, topic.topic, wanted)
            partitions.append(make(partition_type, error_code=error, partition=wanted.partition,
                                   leader_epoch=epoch, end_offset=end_offset))
        topics.append(make(topic_type, topic=topic.topic, partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics))
