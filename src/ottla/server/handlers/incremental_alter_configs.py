"""IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT (list configs) on topic configs,
on dynamic broker configs (KIP-226: a broker id, or "" for the cluster-wide default) and on
group configs (KIP-848 GROUP resources)."""

from datetime import timedelta

from ...cluster.store import StoreError
from ...config import BROKER_CONFIGS, ConfigError, render, validate_topic_configs
from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ...group_config import GroupConfig
from .describe_configs import BROKER_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE, topic_config

API_KEY = 44
VERSIONS = (0, 1)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_LIST_CONFIGS = frozenset({"cleanup.policy", "log.cleanup.policy"})


def _apply(current: dict, changes, effective) -> dict:
    """The entity's new settings. APPEND and SUBTRACT start from the config's current
    value, default included (`effective(name)`), as Kafka does: appending compact to a new
    topic gives delete,compact."""
    updated = {name: render(value) for name, value in current.items()}
    for change in changes:
        if change.config_operation == SET:
            updated[change.name] = change.value
        elif change.config_operation == DELETE:
            updated.pop(change.name, None)
        elif change.config_operation in (APPEND, SUBTRACT):
            if change.name not in _LIST_CONFIGS:
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


async def alter_topic(broker, name: str, new_configs: dict, validate_only: bool) -> None:
    """Shared by AlterConfigs and IncrementalAlterConfigs: validate, then store durably (in a
    cluster in the store, from where every broker holding a replica applies it)."""
    if broker.membership is not None:
        await broker.dynamic_configs.alter_topic(name, new_configs, validate_only)
        return
    if name not in broker.logs.topics:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
    try:
        configs = validate_topic_configs(new_configs)
    except ConfigError as exc:
        raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
    if not validate_only:
        broker.logs.alter_configs(name, configs)


def broker_entity(broker, name: str) -> int | None:
    """Kafka's getBrokerId: "" is the cluster default (None); otherwise this broker's own id."""
    if name == "":
        return None
    try:
        broker_id = int(name)
    except ValueError:
        raise KafkaError(ErrorCode.invalid_request, f"Broker id must be an integer, but it is: {name}") from None
    if broker_id != broker.node_id:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Unexpected broker id, expected {broker.node_id}, but received {name}")
    return broker_id


async def answer_per_resource(ctx, resources, alter):
    """The response of both AlterConfigs forms: `await alter(resource)` for each resource,
    whose KafkaError becomes that resource's error while the others still go ahead."""
    result_type = nested(ctx.response_type, "AlterConfigsResourceResponse")
    results = []
    for resource in resources:
        error, message = ErrorCode.none, None
        try:
            if resource.resource_type not in (TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE):
                raise KafkaError(ErrorCode.invalid_request, f"Unknown resource type {resource.resource_type}")
            await alter(resource)
        except KafkaError as exc:
            error, message = exc.code, exc.message
        except StoreError as exc:
            error, message = ErrorCode.unknown_server_error, f"the cluster's configs are unreachable: {exc}"
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name))
    return make(ctx.response_type, throttle_time=timedelta(0), responses=tuple(results))


async def handle(ctx, request):
    broker = ctx.broker

    async def alter(resource) -> None:
        name = resource.resource_name
        if resource.resource_type == TOPIC_RESOURCE:
            try:
                config = await topic_config(broker, name)
            except KafkaError:
                raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist") from None
            new = _apply(config.overrides, resource.configs, lambda n: render(config[n]))
            await alter_topic(broker, name, new, request.validate_only)
        elif resource.resource_type == GROUP_RESOURCE:
            current = await broker.dynamic_configs.group_configs(name)
            new = _apply(current, resource.configs, lambda n: render(GroupConfig(broker.config, current)[n]))
            await broker.dynamic_configs.alter_group(name, new, request.validate_only)
        else:
            broker_id = broker_entity(broker, name)
            current = await broker.dynamic_configs.stored_broker_configs(broker_id)
            new = _apply(current, resource.configs, lambda n: render(BROKER_CONFIGS[n].default))
            await broker.dynamic_configs.alter_broker(broker_id, new, request.validate_only)

    return await answer_per_resource(ctx, request.resources, alter)
