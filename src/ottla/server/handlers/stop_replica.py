"""StopReplica: stop being a replica of these partitions, and with `delete_partition` drop the data."""

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested

API_KEY = 5
VERSIONS = (3, 4)  # per-partition leader epoch and delete flag; the controller sends v4


async def handle(ctx, request):
    response_type = ctx.response_type
    error_type = nested(response_type, "StopReplicaPartitionError")
    link = ctx.broker.controller_link
    if link is None:
        return make(response_type, error_code=ErrorCode.stale_controller_epoch, partition_errors=())
    try:
        errors = await link.stop_replica(request)
    except KafkaError as exc:
        return make(response_type, error_code=exc.code, partition_errors=())
    return make(response_type, error_code=ErrorCode.none, partition_errors=tuple(
        make(error_type, topic_name=topic, partition_index=partition, error_code=error)
        for (topic, partition), error in sorted(errors.items())))
