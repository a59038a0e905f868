"""SyncGroup: the leader hands in the assignment; every member gets its part once it is durable."""

from datetime import timedelta

from ...coordinator.group import SyncResult
from ..replies import authorized, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 14
# v3: static members (KIP-345); v5: protocol type and name, checked against the group's.
VERSIONS = (0, 5)


async def handle(ctx, request):
    future, respond = reply_future()
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        respond(SyncResult(ErrorCode.group_authorization_failed))
    else:
        ctx.broker.groups.coordinator.sync_group(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            assignments={a.member_id: a.assignment for a in request.assignments},
            now_ms=now_ms(),
            on_complete=respond,
        )
    result = await future
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=result.error,
                protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                assignment=result.assignment)
