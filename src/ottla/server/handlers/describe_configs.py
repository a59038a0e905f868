"""DescribeConfigs for topics and the broker, with Kafka's config sources and synonyms.

The broker lists every config it has, the static ones fixed at start (listeners, log dirs)
included; with include_synonyms each entry carries where its value could come from, most
specific first, as Kafka reports them (topic override, static broker config, default).

A resource named several times with the same keys is answered once (clients match results
by resource): one 350 KB request naming the broker 50,000 times would otherwise build a
response of 111 MB. The loop yields to other connections every `_YIELD_EVERY` resources.
"""

import asyncio
from datetime import timedelta

from ...config import BROKER_CONFIGS, TOPIC_CONFIGS, TOPIC_TO_BROKER_SYNONYM
from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 32
VERSIONS = (0, 4)  # v0 (removed in Kafka 4.0, KIP-896) has is_default instead of a source

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# Kafka's ConfigSource codes.
SOURCE_CODES = {"topic": 1, "broker": 4, "default": 5}
_STATIC_BROKER, _DEFAULT = 4, 5
_DERIVED_FROM = {"log.retention.ms": "log.retention.hours", "log.roll.ms": "log.roll.hours",
                 "log.flush.interval.ms": "log.flush.scheduler.interval.ms"}
# Kafka's ConfigType codes (DescribeConfigs v3+).
_TYPE_CODES = {bool: 1, str: 2, int: 5, float: 6}
_YIELD_EVERY = 256


def _render(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def topic_config_entries(config) -> list[tuple[str, str | None, str]]:
    return [(name, _render(config[name]), config.source(name)) for name in sorted(TOPIC_CONFIGS)]


def _topic_synonyms(config, name: str) -> list[tuple[str, str | None, int]]:
    synonyms = []
    if name in config.overrides:
        synonyms.append((name, _render(config.overrides[name]), SOURCE_CODES["topic"]))
    broker_name = TOPIC_TO_BROKER_SYNONYM.get(name)
    if broker_name is None:
        return synonyms + [(name, _render(TOPIC_CONFIGS[name].default), _DEFAULT)]
    if not config.broker.is_default(broker_name):
        synonyms.append((broker_name, _render(config.broker[broker_name]), _STATIC_BROKER))
    # A default derived from another setting is reported under that one, as Kafka does
    # (retention.ms: log.retention.ms, then log.retention.hours=168).
    broker_name = _DERIVED_FROM.get(broker_name, broker_name)
    return synonyms + [(broker_name, _render(BROKER_CONFIGS[broker_name].default), _DEFAULT)]


def _broker_entries(broker) -> list[tuple[str, str | None, str, object, list]]:
    """Every broker config: the ones set or defaulted in BrokerConfig, then the static ones
    fixed when the broker started (what it listens on and where its log lives)."""
    config = broker.config
    entries = []
    for name in sorted(BROKER_CONFIGS):
        value, base = config[name], _DERIVED_FROM.get(name, name)
        source = "default" if config.is_default(name) else "broker"
        synonyms = [] if source == "default" else [(name, _render(value), _STATIC_BROKER)]
        entries.append((name, _render(value), source, value,
                        synonyms + [(base, _render(BROKER_CONFIGS[base].default), _DEFAULT)]))
    host, port = broker.advertised
    static = {
        "listeners": f"PLAINTEXT://{broker.host}:{broker.port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(broker.data_dir),
    }
    for name, value in static.items():
        entries.append((name, value, "broker", value, [(name, value, _STATIC_BROKER)]))
    return sorted(entries)


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    result_type = nested(response_type, "DescribeConfigsResult")
    entry_type = nested(response_type, "DescribeConfigsResourceResult")
    synonym_type = nested(response_type, "DescribeConfigsSynonym")
    results = []
    seen = set()
    for resource in request.resources:
        keys = tuple(resource.configuration_keys) if resource.configuration_keys is not None else None
        if (resource.resource_type, resource.resource_name, keys) in seen:
            continue
        seen.add((resource.resource_type, resource.resource_name, keys))
        if len(seen) % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        error, message, entries = ErrorCode.none, None, []
        if resource.resource_type == TOPIC_RESOURCE:
            info = broker.logs.topics.get(resource.resource_name)
            if info is None:
                error, message = ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist"
            else:
                entries = [(n, v, s, info.config[n], _topic_synonyms(info.config, n))
                           for n, v, s in topic_config_entries(info.config)]
        elif resource.resource_type == BROKER_RESOURCE:
            if resource.resource_name not in ("", str(broker.node_id)):
                error, message = ErrorCode.invalid_request, f"Unexpected broker id {resource.resource_name}"
            else:
                entries = _broker_entries(broker)
        else:
            error, message = ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
        wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        with_synonyms = getattr(request, "include_synonyms", False)
        configs = tuple(
            make(entry_type, name=name, value=value, read_only=resource.resource_type == BROKER_RESOURCE,
                 config_source=SOURCE_CODES[source], is_sensitive=False,
                 synonyms=tuple(make(synonym_type, name=n, value=v, source=code) for n, v, code in synonyms)
                 if with_synonyms else (),
                 config_type=_TYPE_CODES.get(type(raw), 0), documentation=None,
                 is_default=source == "default")
            for name, value, source, raw, synonyms in entries
            if wanted is None or name in wanted
        )
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name,
                            configs=configs))
    return make(response_type, throttle_time=timedelta(0), results=tuple(results))
