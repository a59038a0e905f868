"""IncrementalAlterConfigs for topic configs: SET, DELETE, APPEND and SUBTRACT (list configs)."""

from datetime import timedelta

from ...config import ConfigError, validate_topic_configs
from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from .describe_configs import BROKER_RESOURCE, TOPIC_RESOURCE

API_KEY = 44
VERSIONS = (0, 1)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _apply(current: dict, changes, effective) -> dict:
    """The topic's new overrides. APPEND and SUBTRACT start from the config's current
    value, default included (`effective(name)`), as Kafka does: appending compact to a new
    topic gives delete,compact."""
    updated = {name: str(value) for name, value in current.items()}
    for change in changes:
        if change.config_operation == SET:
            updated[change.name] = change.value
        elif change.config_operation == DELETE:
            updated.pop(change.name, None)
        elif change.config_operation in (APPEND, SUBTRACT):
            if change.name != "cleanup.policy":
                raise KafkaError(ErrorCode.invalid_config, f"{change.name} is not a list config")
            value = updated[change.name] if change.name in updated else str(effective(change.name))
            items = [i for i in value.split(",") if i]
            for item in (change.value or "").split(","):
                if change.config_operation == APPEND and item not in items:
                    items.append(item)
                elif change.config_operation == SUBTRACT and item in items:
                    items.remove(item)
            updated[change.name] = ",".join(items)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"unknown config operation {change.config_operation}")
    return updated


def alter_topic(broker, name: str, new_configs: dict, validate_only: bool) -> None:
    """Shared by AlterConfigs and IncrementalAlterConfigs: validate, then store durably."""
    if name not in broker.logs.topics:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
    try:
        configs = validate_topic_configs(new_configs)
    except ConfigError as exc:
        raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
    if not validate_only:
        broker.logs.alter_configs(name, configs)


def answer_per_resource(ctx, resources, alter):
    """The response of both AlterConfigs forms: `alter(resource)` for each resource, whose
    KafkaError becomes that resource's error while the others still go ahead."""
    result_type = nested(ctx.response_type, "AlterConfigsResourceResponse")
    results = []
    for resource in resources:
        error, message = ErrorCode.none, None
        try:
            alter(resource)
        except KafkaError as exc:
            error, message = exc.code, exc.message
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name))
    return make(ctx.response_type, throttle_time=timedelta(0), responses=tuple(results))


async def handle(ctx, request):
    broker = ctx.broker

    def alter(resource) -> None:
        if resource.resource_type == TOPIC_RESOURCE:
            info = broker.logs.topics.get(resource.resource_name)
            current, effective = (info.config.overrides, info.config.__getitem__) if info else ({}, lambda _: "")
            alter_topic(broker, resource.resource_name, _apply(current, resource.configs, effective),
                        request.validate_only)
        elif resource.resource_type == BROKER_RESOURCE:
            raise KafkaError(ErrorCode.invalid_request, "broker configs are static: set them with --config")
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}")

    return answer_per_resource(ctx, request.resources, alter)
