"""DeleteGroups: removes Empty groups and their offsets (tombstones in `__consumer_offsets`)."""

from datetime import timedelta

from ...coordinator.group.service import reply_future
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 42
VERSIONS = (0, 2)


async def handle(ctx, request):
    future, respond = reply_future()
    ctx.broker.groups.coordinator.delete_groups(group_ids=list(request.groups_names), now_ms=now_ms(),
                                                on_complete=respond)
    results = await future
    response_type = ctx.response_type
    result_type = nested(response_type, "DeletableGroupResult")
    return make(response_type, throttle_time=timedelta(0), results=tuple(
        make(result_type, group_id=group_id, error_code=error) for group_id, error in results.items()))
