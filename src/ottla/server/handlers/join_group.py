"""JoinGroup: answered when the group's rebalance completes (or at once on an error)."""

from datetime import timedelta

from ...coordinator.group import JoinResult
from ..replies import authorized, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 11
# v4: MEMBER_ID_REQUIRED (KIP-394); v5: static members (KIP-345); v7: protocol type in the
# response; v8: reason (KIP-800); v9: skip_assignment for static leaders (KIP-814).
VERSIONS = (0, 9)

_MS = timedelta(milliseconds=1)


async def handle(ctx, request):
    version = ctx.api_version
    session_timeout = request.session_timeout // _MS
    future, respond = reply_future()
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        respond(JoinResult(ErrorCode.group_authorization_failed, request.member_id))
    else:
        ctx.broker.groups.coordinator.join_group(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
            session_timeout_ms=session_timeout,
            # v0 has one timeout for both
            rebalance_timeout_ms=request.rebalance_timeout // _MS if version >= 1 else session_timeout,
            client_id=ctx.client_id or "",
            client_host=ctx.client_host,
            require_known_member_id=version >= 4,
            supports_skip_assignment=version >= 9,
            now_ms=now_ms(),
            on_complete=respond,
            reason=getattr(request, "reason", None),
        )
    result = await future
    response_type = ctx.response_type
    member_type = nested(response_type, "JoinGroupResponseMember")
    return make(
        response_type,
        throttle_time=timedelta(0),
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        # non-nullable before v7
        protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(make(member_type, member_id=m.member_id, group_instance_id=m.group_instance_id,
                           metadata=m.metadata) for m in result.members),
    )
