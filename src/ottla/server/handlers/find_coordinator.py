"""FindCoordinator: this node leads every partition of both internal topics, so it coordinates
every group and every transactional id."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 10
# v4 batches the keys (KIP-699); v6 adds share-group keys (type 2), which are not served.
VERSIONS = (0, 6)

GROUP, TRANSACTION = 0, 1


async def handle(ctx, request):
    response_type = ctx.response_type
    host, port = ctx.broker.advertised
    key_type = getattr(request, "key_type", GROUP)
    if key_type in (GROUP, TRANSACTION):
        answer = dict(error_code=ErrorCode.none, error_message=None, node_id=ctx.broker.node_id, host=host, port=port)
    else:
        answer = dict(error_code=ErrorCode.invalid_request, error_message=f"unsupported key type {key_type}",
                      node_id=-1, host="", port=-1)
    if ctx.api_version >= 4:
        coordinator_type = nested(response_type, "Coordinator")
        return make(response_type, throttle_time=timedelta(0), coordinators=tuple(
            make(coordinator_type, key=key, **answer) for key in request.coordinator_keys))
    return make(response_type, throttle_time=timedelta(0), **answer)
