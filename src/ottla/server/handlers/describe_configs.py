"""DescribeConfigs for topics and the broker, with Kafka's config sources."""

from datetime import timedelta

from ...config import BROKER_CONFIGS, TOPIC_CONFIGS
from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 32
VERSIONS = (0, 4)  # v0 (removed in Kafka 4.0, KIP-896) has is_default instead of a source

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# Kafka's ConfigSource codes.
SOURCE_CODES = {"topic": 1, "broker": 4, "default": 5}
# Kafka's ConfigType codes (DescribeConfigs v3+).
_TYPE_CODES = {bool: 1, str: 2, int: 5, float: 6}


def _render(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def topic_config_entries(config) -> list[tuple[str, str | None, str]]:
    return [(name, _render(config[name]), config.source(name)) for name in sorted(TOPIC_CONFIGS)]



async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    result_type = nested(response_type, "DescribeConfigsResult")
    entry_type = nested(response_type, "DescribeConfigsResourceResult")
    results = []
    for resource in request.resources:
        error, message, entries = ErrorCode.none, None, []
        if resource.resource_type == TOPIC_RESOURCE:
            info = broker.logs.topics.get(resource.resource_name)
            if info is None:
                error, message = ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist"
            else:
                entries = [(n, v, s, info.config[n]) for n, v, s in topic_config_entries(info.config)]
        elif resource.resource_type == BROKER_RESOURCE:
            if resource.resource_name not in ("", str(broker.node_id)):
                error, message = ErrorCode.invalid_request, f"Unexpected broker id {resource.resource_name}"
            else:
                config = broker.config
                entries = [(n, _render(config[n]), "default" if config.is_default(n) else "broker", config[n])
                           for n in sorted(BROKER_CONFIGS)]
        else:
            error, message = ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
        wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        configs = tuple(
            make(entry_type, name=name, value=value, read_only=resource.resource_type == BROKER_RESOURCE,
                 config_source=SOURCE_CODES[source], is_sensitive=False, synonyms=(),
                 config_type=_TYPE_CODES.get(type(raw), 0), documentation=None,
                 is_default=source == "default")
            for name, value, source, raw in entries
            if wanted is None or name in wanted
        )
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name,
                            configs=configs))
    return make(response_type, throttle_time=timedelta(0), results=tuple(results))
