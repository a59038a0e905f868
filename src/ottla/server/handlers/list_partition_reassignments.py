"""ListPartitionReassignments (KIP-455): the reassignments in progress; controller only."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 46
VERSIONS = (0, 0)


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    topic_type = nested(response_type, "OngoingTopicReassignment")
    partition_type = nested(response_type, "OngoingPartitionReassignment")
    service = broker.controller_service
    if service is not None and not service.active:
        return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.not_controller,
                    error_message="This is not the correct controller for this cluster.", topics=())
    wanted = None if request.topics is None else [
        (t.name, int(p)) for t in request.topics for p in t.partition_indexes]
    ongoing = {} if service is None else (await service.list_reassignments(wanted) or {})
    by_topic: dict[str, list] = {}
    for (topic, partition), (replicas, adding, removing) in sorted(ongoing.items()):
        by_topic.setdefault(topic, []).append(make(
            partition_type, partition_index=partition, replicas=tuple(replicas),
            adding_replicas=tuple(adding), removing_replicas=tuple(removing)))
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, error_message=None,
                topics=tuple(make(topic_type, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
