"""ControlledShutdown: a broker about to stop asks the controller to move its leadership away.

Answered by the controller only (NOT_CONTROLLER elsewhere); the answer lists the partitions
the broker still leads, and the broker asks again until none are left or its retries run out.
"""

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 7
VERSIONS = (1, 3)  # v0 has a header without client id; v2 adds the broker epoch (KIP-380)


async def handle(ctx, request):
    response_type = ctx.response_type
    remaining_type = nested(response_type, "RemainingPartition")
    service = ctx.broker.controller_service
    if service is None or not service.active:
        return make(response_type, error_code=ErrorCode.not_controller, remaining_partitions=())
    error, remaining = await service.controlled_shutdown(request.broker_id, getattr(request, "broker_epoch", -1))
    return make(response_type, error_code=error, remaining_partitions=tuple(
        make(remaining_type, topic_name=topic, partition_index=partition) for topic, partition in sorted(remaining)))
