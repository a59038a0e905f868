"""ListGroups: the groups this coordinator has, optionally filtered by state and type."""

from datetime import timedelta

from ..replies import authorized
from ...producer_state.authorizer import CLUSTER_NAME, Operation, ResourceType
from ...protocol.build import make, nested

API_KEY = 16
# v4: state filter (KIP-518); v5: type filter (KIP-848).
VERSIONS = (0, 5)


async def handle(ctx, request):
    result = ctx.broker.groups.coordinator.list_groups(states=getattr(request, "states_filter", ()),
                                                       types=getattr(request, "types_filter", ()))
    # Describe on the cluster shows every group; otherwise only the groups one may describe.
    everything = authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
    response_type = ctx.response_type
    group_type = nested(response_type, "ListedGroup")
    return make(response_type, throttle_time=timedelta(0), error_code=result.error, groups=tuple(
        make(group_type, group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
             group_type=g.group_type)
        for g in result.groups
        if everything or authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, g.group_id)))
