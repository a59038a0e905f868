"""AlterConfigs (the legacy whole-set form): replaces a topic's overrides, a group's configs,
or the dynamic configs of this broker or of the cluster default."""

from .describe_configs import GROUP_RESOURCE, TOPIC_RESOURCE
from .incremental_alter_configs import alter_topic, answer_per_resource, broker_entity

API_KEY = 33
VERSIONS = (0, 2)


async def handle(ctx, request):
    broker = ctx.broker

    async def alter(resource) -> None:
        configs = {c.name: c.value for c in resource.configs}
        if resource.resource_type == TOPIC_RESOURCE:
            await alter_topic(broker, resource.resource_name, configs, request.validate_only)
        elif resource.resource_type == GROUP_RESOURCE:
            await broker.dynamic_configs.alter_group(resource.resource_name, configs, request.validate_only)
        else:
            await broker.dynamic_configs.alter_broker(broker_entity(broker, resource.resource_name), configs,
                                                      request.validate_only)

    return await answer_per_resource(ctx, request.resources, alter)
