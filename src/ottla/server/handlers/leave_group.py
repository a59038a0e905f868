"""LeaveGroup: members leave (v3+: several at once, static ones by instance id)."""

from datetime import timedelta

from ...coordinator.group import LeaveResult, LeavingMember
from ..replies import authorized
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 13
# v3: batch of members (KIP-345); v5: reason (KIP-800).
VERSIONS = (0, 5)


async def handle(ctx, request):
    if ctx.api_version >= 3:
        leaving = [LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in request.members]
    else:
        leaving = [LeavingMember(request.member_id)]
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        result = LeaveResult(ErrorCode.group_authorization_failed, [])
    else:
        result = ctx.broker.groups.coordinator.leave_group(group_id=request.group_id, members=leaving,
                                                            now_ms=now_ms())
    response_type = ctx.response_type
    if ctx.api_version < 3:
        # One member: its error is the request's.
        error = result.error
        if error == ErrorCode.none and result.member_errors:
            error = result.member_errors[0]
        return make(response_type, throttle_time=timedelta(0), error_code=error)
    member_type = nested(response_type, "MemberResponse")
    return make(response_type, throttle_time=timedelta(0), error_code=result.error, members=tuple(
        make(member_type, member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e)
        for m, e in zip(leaving, result.member_errors)))
