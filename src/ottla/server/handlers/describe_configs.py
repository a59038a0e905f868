"""DescribeConfigs for topics, the broker and groups, with Kafka's config sources and synonyms.

The broker lists every config it has, the static ones fixed at start (listeners, log dirs)
included, and the Kafka configs it was started with and does not implement (ssl.*, sasl.*, ...); "" (the cluster default) lists the dynamic defaults only. With include_synonyms each
entry carries where its value could come from, most specific first, as Kafka reports them
(topic override, dynamic per-broker, dynamic default, static broker config, default). In a
cluster a topic's configs are read from the store, so any broker answers for any topic.
A group (KIP-848 GROUP resource) lists every group config Kafka defines, its own settings over
the broker's `group.*` defaults, whether or not the group exists (as Kafka).

A password (Kafka's PASSWORD-typed configs, any `*.password`, under their own name or a
listener's) is reported is_sensitive with a null value, its synonyms too, as Kafka does.

`transaction.version` is no config in Kafka 4 but a feature (finalized with `kafka-features`, reported
by ApiVersions, `server/features.py`): it is left out, as Kafka's DescribeConfigs leaves it out,
unless the broker was started with it set, which Kafka too lists as a property of unknown type.

A resource named several times with the same keys is answered once (clients match results
by resource): one 350 KB request naming the broker 50,000 times would otherwise build a
response of 111 MB. The loop yields to other connections every `_YIELD_EVERY` resources.
"""

import asyncio
from datetime import timedelta

from ...config import (BROKER_CONFIGS, DYNAMIC_BROKER_CONFIGS, TOPIC_CONFIGS, ConfigError, TopicConfig,
                       broker_synonyms, render)
from ...config_names import (LISTENER_MECHANISM_CONFIGS, LISTENER_SSL_CONFIGS, PASSWORD_CONFIGS, is_sensitive,
                             listener_security_config)
from ...errors import ErrorCode, KafkaError
from ...group_config import CONFIG_TYPES, GROUP_CONFIGS, GroupConfig
from ...protocol.build import make, nested
from ..features import TRANSACTION_VERSION

API_KEY = 32
VERSIONS = (0, 4)  # v0 (removed in Kafka 4.0, KIP-896) has is_default instead of a source

TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32
# Kafka's ConfigSource codes.
SOURCE_CODES = {"topic": 1, "dynamic_broker": 2, "dynamic_default": 3, "broker": 4, "default": 5, "group": 8}
# Kafka's ConfigType codes (DescribeConfigs v3+).
_TYPE_CODES = {bool: 1, str: 2, int: 5, float: 6}
_UNKNOWN, _PASSWORD = 0, 9
_YIELD_EVERY = 256


def _type_code(value) -> int:
    return _TYPE_CODES.get(type(value), 0)


def topic_config_entries(config) -> list[tuple[str, str | None, str]]:
    return [(name, render(config[name]), config.source(name)) for name in sorted(TOPIC_CONFIGS)]


async def topic_config(broker, name: str) -> TopicConfig:
    """A topic's configs as the cluster has them: on a single node the local catalog; in a
    cluster `/config/topics/<t>` for any topic the metadata knows (as Kafka's ZK mode), so a
    broker holding no replica answers too. UNKNOWN_TOPIC_OR_PARTITION otherwise."""
    if broker.membership is None:
        info = broker.logs.topics.get(name)
        if info is not None:
            return info.config
    elif broker.metadata.has_topic(name):
        stored = await asyncio.to_thread(broker.membership.store.topic_configs, name)
        try:
            return TopicConfig(broker.config, stored)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, f"stored configs of topic {name}: {exc}") from None
    raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")


def _broker_entries(broker, per_broker: bool) -> list[tuple[str, str | None, str, int, list, bool]]:
    """Kafka's createBrokerConfigEntry. This broker (`per_broker`): every config it has, the
    static ones fixed at start (what it listens on, where its log lives) included; the
    cluster default (""): only the dynamic defaults, without per-broker synonyms."""
    config = broker.config
    entries = []
    names = sorted(set(BROKER_CONFIGS) - {TRANSACTION_VERSION}) if per_broker else sorted(config.dynamic_default)
    for name in names:
        synonyms = broker_synonyms(config, name)
        if not per_broker:
            synonyms = [s for s in synonyms if s[2] != "dynamic_broker"]
        value = config[name] if per_broker else config.dynamic_default[name]
        entries.append((name, render(value), synonyms[0][2] if synonyms else "default",
                        _PASSWORD if name in PASSWORD_CONFIGS else _type_code(value), synonyms,
                        name not in DYNAMIC_BROKER_CONFIGS))
    if not per_broker:
        return entries
    host, port = broker.advertised
    static = {
        "listeners": f"PLAINTEXT://{broker.host}:{broker.port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(broker.data_dir),
    }
    for name, value in static.items():
        entries.append((name, value, "broker", _type_code(value), [(name, value, "broker")], True))
    # Kafka's configs it was started with and does not implement (ssl.*, sasl.*, ...), as given,
    # and the feature level if it was given as a config.
    started_with = dict(config.not_implemented)
    if TRANSACTION_VERSION in config.overrides:
        started_with[TRANSACTION_VERSION] = render(config.overrides[TRANSACTION_VERSION])
    for name, value in started_with.items():
        if name not in static:
            entries.append((name, value, "broker", _PASSWORD if name in PASSWORD_CONFIGS else _UNKNOWN,
                            [(name, value, "broker")], name not in LISTENER_SSL_CONFIGS))  # Kafka's ALL_DYNAMIC_CONFIGS
    # A listener's security configs set at runtime, and the static base config each overrides.
    for name, value in config.dynamic.items():
        base = listener_security_config(name)
        if base is not None:
            synonyms = [(name, value, "dynamic_broker")]
            if base in config.not_implemented:
                synonyms.append((base, config.not_implemented[base], "broker"))
            entries.append((name, value, "dynamic_broker", {**LISTENER_SSL_CONFIGS, **LISTENER_MECHANISM_CONFIGS}[base],
                            synonyms, False))
    return sorted(entries)


async def _entries(broker, resource) -> list:
    if resource.resource_type == TOPIC_RESOURCE:
        config = await topic_config(broker, resource.resource_name)
        return [(n, v, s, _type_code(config[n]), config.synonyms(n), False) for n, v, s in topic_config_entries(config)]
    if resource.resource_type == BROKER_RESOURCE:
        if resource.resource_name not in ("", str(broker.node_id)):
            raise KafkaError(ErrorCode.invalid_request, f"Unexpected broker id, expected {broker.node_id} or "
                                                        f"empty string, but received {resource.resource_name}")
        return _broker_entries(broker, resource.resource_name != "")
    if resource.resource_type == GROUP_RESOURCE:
        if not resource.resource_name:
            raise KafkaError(ErrorCode.invalid_request, "Group name must not be empty")
        config = GroupConfig(broker.config, await broker.dynamic_configs.group_configs(resource.resource_name))
        return [(name, render(config[name]), synonyms[0][2], CONFIG_TYPES[name], synonyms, False)
                for name in sorted(GROUP_CONFIGS) for synonyms in (config.synonyms(name),)]
    raise KafkaError(ErrorCode.invalid_request, f"Unsupported resource type: {resource.resource_type}")


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
        try:
            entries = await _entries(broker, resource)
        except KafkaError as exc:
            error, message = exc.code, exc.message
        wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        with_synonyms = getattr(request, "include_synonyms", False)
        configs = tuple(
            make(entry_type, name=name, value=None if sensitive else value, read_only=read_only,
                 config_source=SOURCE_CODES[source], is_sensitive=sensitive,
                 synonyms=tuple(make(synonym_type, name=n, value=None if sensitive else v, source=SOURCE_CODES[layer])
                                for n, v, layer in synonyms) if with_synonyms else (),
                 config_type=config_type, documentation=None, is_default=source == "default")
            for name, value, source, config_type, synonyms, read_only in entries
            if wanted is None or name in wanted
            for sensitive in (is_sensitive(name),)  # Kafka's maybeSensitive: a password's value is never sent
        )
        results.append(make(result_type, error_code=error, error_message=message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name,
                            configs=configs))
    return make(response_type, throttle_time=timedelta(0), results=tuple(results))
