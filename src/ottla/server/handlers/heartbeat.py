"""Heartbeat: keeps a member's session alive and tells it when to rejoin."""

from datetime import timedelta

from ..replies import authorized
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 12
# v3: static members (KIP-345).
VERSIONS = (0, 4)


async def handle(ctx, request):
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        error = ErrorCode.group_authorization_failed
    else:
        error = ctx.broker.groups.coordinator.heartbeat(
            group_id=request.group_id, member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            generation_id=request.generation_id, now_ms=now_ms())
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=error)
