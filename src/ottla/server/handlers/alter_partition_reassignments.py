"""AlterPartitionReassignments (KIP-455): move replicas, or cancel (replicas null); controller only.

v1 (Kafka 4.x, KIP-860) may forbid a change of replication factor: a target whose size is not
that of the replica set the partition is headed for is INVALID_REPLICATION_FACTOR, after the
checks every target gets (one node: any target but this broker fails those first)."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 45
VERSIONS = (0, 1)


def _single_node(broker, targets):
    """One broker: its own id is the only valid target, and nothing is ever in progress."""
    results = {}
    for (topic, partition), target in targets.items():
        if broker.metadata.partition(topic, partition) is None:
            results[(topic, partition)] = (ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
        elif target is None:
            results[(topic, partition)] = (ErrorCode.no_reassignment_in_progress, None)
        elif tuple(target) != (broker.node_id,):
            results[(topic, partition)] = (ErrorCode.invalid_replica_assignment,
                                           f"Replica assignment has brokers that are not alive: {list(target)}")
        else:
            results[(topic, partition)] = (ErrorCode.none, None)
    return results


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    topic_type = nested(response_type, "ReassignableTopicResponse")
    partition_type = nested(response_type, "ReassignablePartitionResponse")
    targets = {(t.name, int(p.partition_index)): None if p.replicas is None else tuple(int(r) for r in p.replicas)
               for t in request.topics for p in t.partitions}
    allow_rf_change = getattr(request, "allow_replication_factor_change", True)
    service = broker.controller_service
    if service is not None and not service.active:
        return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.not_controller,
                    error_message="This is not the correct controller for this cluster.", responses=(),
                    allow_replication_factor_change=allow_rf_change)
    results = _single_node(broker, targets) if service is None else \
        await service.alter_reassignments(targets, allow_rf_change)
    by_topic: dict[str, list] = {}
    for (topic, partition), (error, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            make(partition_type, partition_index=partition, error_code=error, error_message=message))
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, error_message=None,
                allow_replication_factor_change=allow_rf_change,
                responses=tuple(make(topic_type, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
