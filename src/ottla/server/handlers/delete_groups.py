"""DeleteGroups: removes Empty groups and their offsets (tombstones in `__consumer_offsets`)."""

from datetime import timedelta

from ..replies import authorized, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 42
VERSIONS = (0, 2)


async def handle(ctx, request):
    allowed = [g for g in request.groups_names if authorized(ctx, Operation.DELETE, ResourceType.GROUP, g)]
    results = {g: ErrorCode.group_authorization_failed for g in request.groups_names}
    if allowed:
        future, respond = reply_future()
        ctx.broker.groups.coordinator.delete_groups(group_ids=allowed, now_ms=now_ms(), on_complete=respond)
        results.update(await future)
    response_type = ctx.response_type
    result_type = nested(response_type, "DeletableGroupResult")
    return make(response_type, throttle_time=timedelta(0), results=tuple(
        make(result_type, group_id=group_id, error_code=error) for group_id, error in results.items()))
