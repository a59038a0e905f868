"""ListConfigResources (v0: ListClientMetricsResources): the resources that have configs.

Topics, the brokers and the groups with group configs (KIP-848, stored where every broker
reads them) have configs; Ottla has no client-metrics subscriptions, so that type lists
nothing. Other types are INVALID_REQUEST, as in Kafka.
"""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 74
VERSIONS = (0, 1)

TOPIC, BROKER, CLIENT_METRICS, GROUP = 2, 4, 16, 32


async def handle(ctx, request):
    metadata = ctx.broker.metadata
    resource_type = nested(ctx.response_type, "ConfigResource")
    wanted = set(getattr(request, "resource_types", ()) or ()) if ctx.api_version >= 1 else {CLIENT_METRICS}
    if not wanted:
        wanted = {TOPIC, BROKER, CLIENT_METRICS, GROUP}
    if wanted - {TOPIC, BROKER, CLIENT_METRICS, GROUP}:
        return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.invalid_request,
                    config_resources=())
    resources = []
    if TOPIC in wanted:
        resources += [make(resource_type, resource_name=name, resource_type=TOPIC) for name in metadata.topic_names()]
    if BROKER in wanted:
        resources += [make(resource_type, resource_name=str(b.node_id), resource_type=BROKER) for b in metadata.brokers]
    if GROUP in wanted:
        resources += [make(resource_type, resource_name=name, resource_type=GROUP)
                      for name in await ctx.broker.dynamic_configs.group_config_names()]
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.none,
                config_resources=tuple(resources))
