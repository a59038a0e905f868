"""ElectLeaders (KIP-183, KIP-460): preferred or unclean leader election, answered by the controller.

A cluster broker that is not the controller answers NOT_CONTROLLER (clients send it to the
controller named in Metadata, as Kafka's ZooKeeper mode requires). A single node leads
every partition as its only, preferred replica: ELECTION_NOT_NEEDED.
"""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 43
VERSIONS = (0, 2)
ELECTION_TYPES = {0: "preferred", 1: "unclean"}


def _requested(broker, request):
    if request.topic_partitions is None:  # every partition of the cluster
        if broker.controller_service is None:
            metadata = broker.metadata
            return [(t, p) for t in metadata.topic_names() for p in sorted(metadata.topic(t).partitions)]
        return None
    return [(t.topic, int(p)) for t in request.topic_partitions for p in t.partitions]


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    topic_type = nested(response_type, "ReplicaElectionResult")
    result_type = nested(response_type, "PartitionResult")
    election = ELECTION_TYPES.get(int(getattr(request, "election_type", 0)))
    wanted = _requested(broker, request)
    top_error = ErrorCode.none
    service = broker.controller_service
    if election is None:
        results = {tp: (ErrorCode.invalid_request, "unknown election type") for tp in wanted or ()}
    elif service is None:
        results = {}
        for topic, partition in wanted:
            if broker.metadata.partition(topic, partition) is None:
                results[(topic, partition)] = (ErrorCode.unknown_topic_or_partition, None)
            else:
                results[(topic, partition)] = (ErrorCode.election_not_needed, "Leader is already the preferred replica.")
    elif not service.active:
        top_error = ErrorCode.not_controller
        results = {tp: (ErrorCode.not_controller, None) for tp in wanted or ()}
    else:
        if wanted is None:
            wanted = [tp for tp in service.controller.ctx.partitions()]
        results = await service.elect_leaders(wanted, election)
    by_topic: dict[str, list] = {}
    for (topic, partition), (error, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            make(result_type, partition_id=partition, error_code=error, error_message=message))
    return make(response_type, throttle_time=timedelta(0), error_code=top_error, replica_election_results=tuple(
        make(topic_type, topic=topic, partition_result=tuple(parts)) for topic, parts in by_topic.items()))
