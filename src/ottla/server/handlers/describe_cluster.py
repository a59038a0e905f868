"""DescribeCluster: the alive brokers and the controller, from the metadata cache."""

from datetime import timedelta

from ...errors import ErrorCode
from ...producer_state.authorizer import CLUSTER_NAME, ResourceType
from ...protocol.build import make, nested
from ..replies import NOT_REQUESTED, authorized_operations

API_KEY = 60
VERSIONS = (0, 2)

BROKERS_ENDPOINT = 1


async def handle(ctx, request):
    metadata = ctx.broker.metadata
    response_type = ctx.response_type
    if getattr(request, "endpoint_type", BROKERS_ENDPOINT) != BROKERS_ENDPOINT:
        return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.unsupported_endpoint_type,
                    error_message="only broker endpoints are served", endpoint_type=request.endpoint_type,
                    cluster_id=metadata.cluster_id, controller_id=-1, brokers=(), cluster_authorized_operations=NOT_REQUESTED)
    broker_type = nested(response_type, "DescribeClusterBroker")
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, error_message=None,
                endpoint_type=BROKERS_ENDPOINT, cluster_id=metadata.cluster_id, controller_id=metadata.controller_id,
                brokers=tuple(make(broker_type, broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack,
                                   is_fenced=False) for b in metadata.brokers),
                cluster_authorized_operations=authorized_operations(
                    ctx, ResourceType.CLUSTER, CLUSTER_NAME, request.include_cluster_authorized_operations))
