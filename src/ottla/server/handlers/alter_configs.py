"""AlterConfigs (the legacy whole-set form): replaces a topic's overrides."""

from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from .describe_configs import TOPIC_RESOURCE
from .incremental_alter_configs import alter_topic

API_KEY = 33
VERSIONS = (0, 2)


async def handle(ctx, request):
    response_type = ctx.response_type
    result_type = nested(response_type, "AlterConfigsResourceResponse")
    results = []
    for resource in request.resources:
        error, message = ErrorCode.none, None
        try:
            if resource.resource_type != TOPIC_RESOURCE:
                raise KafkaError(ErrorCode.invalid_request, "only topic configs can be altered")
            alter_topic(ctx.broker, resource.resource_name, {c.name: c.value for c in resource.configs},
                        request.validate_only)
        except KafkaError as exc:
            error, message = exc.code, exc.message
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name))
    return make(response_type, throttle_time=timedelta(0), responses=tuple(results))
