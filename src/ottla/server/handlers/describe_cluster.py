"""DescribeCluster: this node, as broker and controller."""

from datetime import timedelta

from ...errors import ErrorCode
from ...producer_state.authorizer import CLUSTER_NAME, ResourceType
from ...protocol.build import make, nested
from ..replies import NOT_REQUESTED, authorized_operations

API_KEY = 60
VERSIONS = (0, 2)

BROKERS_ENDPOINT = 1


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    if getattr(request, "endpoint_type", BROKERS_ENDPOINT) != BROKERS_ENDPOINT:
        return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.unsupported_endpoint_type,
                    error_message="only broker endpoints are served", endpoint_type=request.endpoint_type,
                    cluster_id=broker.cluster_id, controller_id=-1, brokers=(), cluster_authorized_operations=NOT_REQUESTED)
    host, port = broker.advertised
    broker_type = nested(response_type, "DescribeClusterBroker")
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, error_message=None,
                endpoint_type=BROKERS_ENDPOINT, cluster_id=broker.cluster_id, controller_id=broker.node_id,
                brokers=(make(broker_type, broker_id=broker.node_id, host=host, port=port, rack=None, is_fenced=False),),
                cluster_authorized_operations=authorized_operations(
                    ctx, ResourceType.CLUSTER, CLUSTER_NAME, request.include_cluster_authorized_operations))
