"""DescribeGroups: state, protocol and members (with metadata and assignment when Stable)."""

from datetime import timedelta

from ...coordinator.group import GroupDescription
from ..replies import authorized, authorized_operations
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested

API_KEY = 15
# v3: authorized operations; v4: static members; v6: a group that does not exist is Dead with
# GROUP_ID_NOT_FOUND and a message; earlier versions report it Dead without an error.
VERSIONS = (0, 6)

async def handle(ctx, request):
    response_type = ctx.response_type
    group_type = nested(response_type, "DescribedGroup")
    member_type = nested(response_type, "DescribedGroupMember")
    groups = []
    for group_id in request.groups:
        if authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            d = ctx.broker.groups.coordinator.describe_group(group_id)
        else:
            d = GroupDescription(group_id, ErrorCode.group_authorization_failed, state="")
        error, message = d.error, None
        if error == ErrorCode.group_id_not_found:
            if ctx.api_version >= 6:
                message = f"Group {group_id} not found."
            else:
                error = ErrorCode.none
        members = tuple(
            make(member_type, member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                 client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
            for m in d.members)
        groups.append(make(group_type, error_code=error, error_message=message, group_id=group_id,
                           group_state=d.state, protocol_type=d.protocol_type,
                           protocol_data=d.protocol, members=members, authorized_operations=authorized_operations(
                               ctx, ResourceType.GROUP, group_id, getattr(request, "include_authorized_operations", False))))
    return make(response_type, throttle_time=timedelta(0), groups=tuple(groups))
