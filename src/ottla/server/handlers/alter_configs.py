"""AlterConfigs (the legacy whole-set form): replaces a topic's overrides."""

from ...errors import ErrorCode, KafkaError
from .describe_configs import TOPIC_RESOURCE
from .incremental_alter_configs import alter_topic, answer_per_resource

API_KEY = 33
VERSIONS = (0, 2)


async def handle(ctx, request):
    def alter(resource) -> None:
        if resource.resource_type != TOPIC_RESOURCE:
            raise KafkaError(ErrorCode.invalid_request, "only topic configs can be altered")
        alter_topic(ctx.broker, resource.resource_name, {c.name: c.value for c in resource.configs},
                    request.validate_only)

    return answer_per_resource(ctx, request.resources, alter)
