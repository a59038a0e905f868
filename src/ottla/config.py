"""Broker and topic configuration, under Kafka's own names and with Kafka's defaults.

Each entry knows its type and default so that `--config key=value` on the command line,
per-topic configs from CreateTopics/IncrementalAlterConfigs, and DescribeConfigs all agree.
Topic configs fall back to the broker's `log.*` settings the way Kafka's do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .config_names import LISTENER_SSL_CONFIGS, is_kafka_broker_config, is_sensitive, listener_security_config
from .errors import ConfigError
from .password_encoder import CIPHERS, KEY_FACTORY_ALGORITHMS

_log = logging.getLogger("ottla.config")


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError(f"expected true or false, got {value!r}")


def _int(value: str | int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def _str(value: str) -> str:
    return str(value)


def _cleanup_policy(value: str) -> str:
    """A list of delete and compact; empty (no cleanup at all) is valid, as in Kafka 3.9."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if any(p not in ("delete", "compact") for p in parts):
        raise ValueError(f"expected delete, compact or both, got {value!r}")
    return ",".join(parts)


def _timestamp_type(value: str) -> str:
    if value not in ("CreateTime", "LogAppendTime"):
        raise ValueError(f"expected CreateTime or LogAppendTime, got {value!r}")
    return value


def _compression_type(value: str) -> str:
    if value not in ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"):
        raise ValueError(f"unknown compression type {value!r}")
    return value


def _transaction_version(value: str | int) -> int:
    level = _int(value)
    if not 0 <= level <= 2:
        raise ValueError(f"supported levels are 0 to 2, got {value!r}")
    return level


def _choice(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value
    return parse


def _aes_key_length(value: str | int) -> int:
    """Kafka takes any length of at least 8 and fails at the first encryption; AES has three."""
    length = _int(value)
    if length not in (128, 192, 256):
        raise ValueError("AES takes keys of 128, 192 or 256 bits")
    return length


@dataclass(frozen=True)
class ConfigDef:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    minimum: int | None = None
    doc: str = ""

    def coerce(self, raw: Any) -> Any:
        try:
            value = self.parse(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid value {raw!r} for config {self.name}: {exc}") from None
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"invalid value {raw!r} for config {self.name}: must be at least {self.minimum}")
        return value


_DAY_MS = 24 * 60 * 60 * 1000

BROKER_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        # broker.id and node.id are synonyms (Kafka's populateSynonyms): set one, or both alike.
        ConfigDef("node.id", _int, 0, 0),
        ConfigDef("broker.id", _int, 0, 0),
        ConfigDef("broker.rack", _str, None),
        # Unset: the broker runs alone. HOST:PORT[,HOST:PORT...][/chroot]: it joins that cluster.
        ConfigDef("zookeeper.connect", _str, None),
        ConfigDef("zookeeper.session.timeout.ms", _int, 18000, 1),
        ConfigDef("zookeeper.connection.timeout.ms", _int, None),  # default: the session timeout
        # The controller (controller/): Kafka's names and defaults.
        ConfigDef("controlled.shutdown.enable", _bool, True),
        ConfigDef("controlled.shutdown.max.retries", _int, 3, 1),
        ConfigDef("controlled.shutdown.retry.backoff.ms", _int, 5000, 0),
        ConfigDef("unclean.leader.election.enable", _bool, False),
        ConfigDef("auto.leader.rebalance.enable", _bool, True),
        ConfigDef("leader.imbalance.check.interval.seconds", _int, 300, 1),
        ConfigDef("leader.imbalance.per.broker.percentage", _int, 10, 0),
        ConfigDef("num.partitions", _int, 1, 1),
        ConfigDef("default.replication.factor", _int, 1, 1),
        ConfigDef("auto.create.topics.enable", _bool, True),
        ConfigDef("delete.topic.enable", _bool, True),
        ConfigDef("message.max.bytes", _int, 1048588, 0),
        ConfigDef("socket.request.max.bytes", _int, 104857600, 1),
        ConfigDef("socket.send.buffer.bytes", _int, 102400, -1),
        ConfigDef("socket.receive.buffer.bytes", _int, 102400, -1),
        # server/connections.py: what all connections together may hold
        ConfigDef("queued.max.request.bytes", _int, -1, -1),
        ConfigDef("connections.max.idle.ms", _int, 600000, 1),
        ConfigDef("max.connections", _int, 2**31 - 1, 0),
        ConfigDef("max.connections.per.ip", _int, 2**31 - 1, 0),
        ConfigDef("log.segment.bytes", _int, 1073741824, 14),
        ConfigDef("log.roll.ms", _int, None),
        ConfigDef("log.roll.hours", _int, 168, 1),
        ConfigDef("log.index.interval.bytes", _int, 4096, 0),
        ConfigDef("log.index.size.max.bytes", _int, 10485760, 4),
        ConfigDef("log.flush.interval.messages", _int, 2**63 - 1, 1),
        ConfigDef("log.flush.interval.ms", _int, None),
        ConfigDef("log.flush.scheduler.interval.ms", _int, 2**63 - 1, 0),
        ConfigDef("log.flush.offset.checkpoint.interval.ms", _int, 60000, 0),
        # Ottla's own (not Kafka's): see log/page_cache.py. 0 leaves the page cache to the kernel.
        ConfigDef("log.page.cache.max.bytes", _int, 256 * 1024 * 1024, 0),
        ConfigDef("log.retention.ms", _int, None),
        ConfigDef("log.retention.minutes", _int, None),
        ConfigDef("log.retention.hours", _int, 168),
        ConfigDef("log.retention.bytes", _int, -1),
        ConfigDef("log.retention.check.interval.ms", _int, 300000, 1),
        ConfigDef("log.cleanup.policy", _cleanup_policy, "delete"),
        ConfigDef("log.message.timestamp.type", _timestamp_type, "CreateTime"),
        ConfigDef("log.message.timestamp.before.max.ms", _int, 2**63 - 1, 0),
        ConfigDef("log.message.timestamp.after.max.ms", _int, 3600000, 0),
        ConfigDef("log.cleaner.min.compaction.lag.ms", _int, 0, 0),
        # The log cleaner (log/cleaner/), Kafka's names and defaults.
        ConfigDef("log.cleaner.enable", _bool, True),
        ConfigDef("log.cleaner.threads", _int, 1, 0),
        ConfigDef("log.cleaner.dedupe.buffer.size", _int, 134217728, 0),
        ConfigDef("log.cleaner.io.buffer.load.factor", float, 0.9, 0),
        ConfigDef("log.cleaner.io.max.bytes.per.second", float, 1.7976931348623157e308, 0),
        ConfigDef("log.cleaner.backoff.ms", _int, 15000, 0),
        ConfigDef("log.cleaner.min.cleanable.ratio", float, 0.5, 0),
        ConfigDef("log.cleaner.delete.retention.ms", _int, _DAY_MS, 0),
        ConfigDef("log.cleaner.max.compaction.lag.ms", _int, 2**63 - 1, 1),
        ConfigDef("compression.type", _compression_type, "producer"),
        ConfigDef("min.insync.replicas", _int, 1, 1),
        ConfigDef("replica.high.watermark.checkpoint.interval.ms", _int, 5000, 1),
        # Replication (server/replica_fetcher.py, server/isr_updates.py): Kafka's names and defaults.
        ConfigDef("replica.lag.time.max.ms", _int, 30000, 1),
        ConfigDef("replica.fetch.min.bytes", _int, 1, 1),
        ConfigDef("replica.fetch.wait.max.ms", _int, 500, 0),
        ConfigDef("replica.fetch.max.bytes", _int, 1048576, 0),
        ConfigDef("replica.fetch.response.max.bytes", _int, 10485760, 0),
        ConfigDef("replica.fetch.backoff.ms", _int, 1000, 0),
        ConfigDef("replica.socket.timeout.ms", _int, 30000, 1),
        ConfigDef("producer.id.expiration.ms", _int, _DAY_MS, 1),
        ConfigDef("producer.id.expiration.check.interval.ms", _int, 600000, 1),
        ConfigDef("offsets.topic.num.partitions", _int, 50, 1),
        ConfigDef("offsets.topic.replication.factor", _int, 3, 1),
        ConfigDef("offsets.topic.segment.bytes", _int, 104857600, 1),
        ConfigDef("offsets.retention.minutes", _int, 10080, 1),
        ConfigDef("offsets.retention.check.interval.ms", _int, 600000, 1),
        ConfigDef("offset.metadata.max.bytes", _int, 4096),
        ConfigDef("group.initial.rebalance.delay.ms", _int, 3000, 0),
        ConfigDef("group.min.session.timeout.ms", _int, 6000),
        ConfigDef("group.max.session.timeout.ms", _int, 1800000),
        ConfigDef("group.max.size", _int, 2**31 - 1, 1),
        # KIP-848 consumer, share and streams groups (Kafka 4.1's GroupCoordinatorConfig and
        # ShareGroupConfig): the defaults and bounds of the GROUP configs (group_config.py).
        ConfigDef("group.consumer.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.consumer.min.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.consumer.max.session.timeout.ms", _int, 60000, 1),
        ConfigDef("group.consumer.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.consumer.min.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.consumer.max.heartbeat.interval.ms", _int, 15000, 1),
        ConfigDef("group.share.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.share.min.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.share.max.session.timeout.ms", _int, 60000, 1),
        ConfigDef("group.share.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.share.min.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.share.max.heartbeat.interval.ms", _int, 15000, 1),
        ConfigDef("group.share.record.lock.duration.ms", _int, 30000, 1000),
        ConfigDef("group.share.min.record.lock.duration.ms", _int, 15000, 1000),
        ConfigDef("group.share.max.record.lock.duration.ms", _int, 60000, 1000),
        ConfigDef("group.streams.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.streams.min.session.timeout.ms", _int, 45000, 1),
        ConfigDef("group.streams.max.session.timeout.ms", _int, 60000, 1),
        ConfigDef("group.streams.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.streams.min.heartbeat.interval.ms", _int, 5000, 1),
        ConfigDef("group.streams.max.heartbeat.interval.ms", _int, 15000, 1),
        ConfigDef("group.streams.num.standby.replicas", _int, 0, 0),
        ConfigDef("group.streams.max.standby.replicas", _int, 2, 0),
        ConfigDef("transaction.state.log.num.partitions", _int, 50, 1),
        ConfigDef("transaction.state.log.replication.factor", _int, 3, 1),
        ConfigDef("transaction.state.log.min.isr", _int, 2, 1),
        ConfigDef("transaction.state.log.segment.bytes", _int, 104857600, 1),
        ConfigDef("transaction.max.timeout.ms", _int, 900000, 1),
        ConfigDef("transactional.id.expiration.ms", _int, 7 * _DAY_MS, 1),
        ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", _int, 10000, 1),
        ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", _int, 3600000, 1),
        # Kafka's feature of that name (finalized cluster-wide there; server/features.py): 2 is
        # KIP-890 part 2, Kafka 4.0's level for a new cluster.
        ConfigDef("transaction.version", _transaction_version, 2),
        # How long a transactions-version-2 write waits out the previous transaction's markers
        # (CONCURRENT_TRANSACTIONS) before it is answered with that error.
        ConfigDef("add.partitions.to.txn.retry.backoff.ms", _int, 20, 1),
        ConfigDef("add.partitions.to.txn.retry.backoff.max.ms", _int, 100, 0),
        ConfigDef("fetch.max.bytes", _int, 57671680, 0),
        ConfigDef("max.incremental.fetch.session.cache.slots", _int, 1000, 0),
        # Dynamic password configs are stored encrypted with the secret (password_encoder.py);
        # the old secret, when set, is the one they were encrypted with before a rotation.
        ConfigDef("password.encoder.secret", _str, None),
        ConfigDef("password.encoder.old.secret", _str, None),
        ConfigDef("password.encoder.keyfactory.algorithm", _choice(KEY_FACTORY_ALGORITHMS), None),
        ConfigDef("password.encoder.cipher.algorithm", _choice(CIPHERS), "AES/CBC/PKCS5Padding"),
        ConfigDef("password.encoder.key.length", _aes_key_length, 128, 8),
        ConfigDef("password.encoder.iterations", _int, 4096, 1024),
    ]
}

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("cleanup.policy", _cleanup_policy, "delete"),
        ConfigDef("compression.type", _compression_type, "producer"),
        ConfigDef("delete.retention.ms", _int, _DAY_MS, 0),
        ConfigDef("file.delete.delay.ms", _int, 60000, 0),
        ConfigDef("flush.messages", _int, 2**63 - 1, 1),
        ConfigDef("flush.ms", _int, 2**63 - 1, 0),
        ConfigDef("index.interval.bytes", _int, 4096, 0),
        ConfigDef("max.message.bytes", _int, 1048588, 0),
        ConfigDef("message.timestamp.type", _timestamp_type, "CreateTime"),
        ConfigDef("message.timestamp.before.max.ms", _int, 2**63 - 1, 0),
        ConfigDef("message.timestamp.after.max.ms", _int, 3600000, 0),
        ConfigDef("min.cleanable.dirty.ratio", float, 0.5),
        ConfigDef("min.compaction.lag.ms", _int, 0, 0),
        ConfigDef("max.compaction.lag.ms", _int, 2**63 - 1, 1),
        ConfigDef("min.insync.replicas", _int, 1, 1),
        ConfigDef("retention.bytes", _int, -1),
        ConfigDef("retention.ms", _int, 7 * _DAY_MS, -1),
        ConfigDef("segment.bytes", _int, 1073741824, 14),
        ConfigDef("segment.index.bytes", _int, 10485760, 4),
        ConfigDef("segment.ms", _int, 7 * _DAY_MS, 1),
        ConfigDef("unclean.leader.election.enable", _bool, False),
    ]
}

# Topic configs Kafka 3.9 defines whose behaviour Ottla does not have (replication
# throttles, tiered storage, preallocation, compression levels, ...). They are accepted,
# stored and described like the others so tools that set them keep working, and the
# first time each is set the broker logs that it is not applied (`report_not_applied`).
_NOT_APPLIED = [
    ConfigDef("compression.gzip.level", _int, -1, -1),
    ConfigDef("compression.lz4.level", _int, 9, 1),
    ConfigDef("compression.zstd.level", _int, 3, -131072),
    ConfigDef("follower.replication.throttled.replicas", _str, ""),
    ConfigDef("leader.replication.throttled.replicas", _str, ""),
    ConfigDef("local.retention.bytes", _int, -2, -2),
    ConfigDef("local.retention.ms", _int, -2, -2),
    ConfigDef("message.downconversion.enable", _bool, True),
    ConfigDef("message.format.version", _str, "3.0-IV1"),
    ConfigDef("message.timestamp.difference.max.ms", _int, 2**63 - 1, 0),
    ConfigDef("preallocate", _bool, False),
    ConfigDef("remote.log.copy.disable", _bool, False),
    ConfigDef("remote.log.delete.on.disable", _bool, False),
    ConfigDef("remote.storage.enable", _bool, False),
    ConfigDef("segment.jitter.ms", _int, 0, 0),
    ConfigDef("unclean.leader.election.enable", _bool, False),
]
# Configs Ottla accepts under Kafka's names but does not act on yet, with what is missing: the
# one place to drop a name from once it works. Broker ones are reported once at start when
# set; topic ones when a topic sets them (`report_not_applied`).
# (min.insync.replicas, fetch.max.bytes and the internal topics' replication factors left it
# once replication, the fetch bounds and the coordinators on the cluster landed.)
_NO_KIP848 = ("Ottla runs classic groups only (no consumer, share or streams groups); it is only the default "
              "DescribeConfigs reports for the group config of that name")
NOT_APPLIED_BROKER_CONFIGS: dict[str, str] = {
    name: _NO_KIP848 for name in (
        "group.consumer.session.timeout.ms", "group.consumer.heartbeat.interval.ms",
        "group.share.session.timeout.ms", "group.share.heartbeat.interval.ms", "group.share.record.lock.duration.ms",
        "group.streams.session.timeout.ms", "group.streams.heartbeat.interval.ms",
        "group.streams.num.standby.replicas")}
NOT_APPLIED_TOPIC_CONFIGS = frozenset(d.name for d in _NOT_APPLIED if d.name not in TOPIC_CONFIGS) | {
    "file.delete.delay.ms",  # deleted segments go at once
}
for _definition in _NOT_APPLIED:
    TOPIC_CONFIGS.setdefault(_definition.name, _definition)
_reported: set[str] = set()
_INTERNAL_TOPIC_FACTORS = ("offsets.topic.replication.factor", "transaction.state.log.replication.factor")


def report_not_applied_broker_configs(config: "BrokerConfig") -> list[str]:
    """One warning line per broker config set on this broker that Ottla does not apply: those
    it knows but does not act on, and Kafka's that it does not implement (named without their
    value, which may be a password)."""
    names = sorted(set(config.overrides) & set(NOT_APPLIED_BROKER_CONFIGS))
    for name in names:
        _log.warning("broker config %s=%s is accepted but not applied by Ottla: %s",
                     name, config.overrides[name], NOT_APPLIED_BROKER_CONFIGS[name])
    # A single node creates its internal topics itself, with the one replica it can hold.
    one_replica = [] if config["zookeeper.connect"] is not None else [
        name for name in _INTERNAL_TOPIC_FACTORS if name in config.overrides and config[name] > 1]
    for name in one_replica:
        _log.warning("broker config %s=%s is not applied: a single node (no zookeeper.connect) keeps one replica of "
                     "its internal topics", name, config[name])
    for name in sorted(config.not_implemented):
        _log.warning("broker config %s is a Kafka config Ottla does not implement: it is ignored", name)
    return sorted(names + one_replica) + sorted(config.not_implemented)


def report_not_applied(names) -> None:
    """Log, once per config name, that a topic sets a config Ottla stores but does not act on."""
    for name in sorted(set(names) & NOT_APPLIED_TOPIC_CONFIGS - _reported):
        _reported.add(name)
        _log.warning("topic config %s is accepted and stored but not applied by Ottla", name)


# Which broker setting supplies a topic config's default (Kafka's synonyms).
TOPIC_TO_BROKER_SYNONYM = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.insync.replicas": "min.insync.replicas",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}


# Broker configs that change at runtime (KIP-226), Kafka's dynamic ones that Ottla really
# applies while running: the topic defaults (every log re-reads them, `LogManager.refresh_configs`;
# the controller takes unclean.leader.election.enable and, turned on, elects the offline partitions
# it now allows, as Kafka's does), the cleaner's throughput settings (read each pass) and the
# connection limits. Kafka's other dynamic configs (log.cleaner.threads, num.*.threads) are
# refused as not dynamic rather than stored unapplied.
# The one exception is a listener's security configs (`coerce_dynamic`): Kafka takes them per
# broker, and a tool that sets a listener's keystore password must not fail; they are stored and
# reported as not applied (no SSL or SASL listener yet).
DYNAMIC_BROKER_CONFIGS = frozenset(TOPIC_TO_BROKER_SYNONYM.values()) | {
    "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms",
    "max.connections", "max.connections.per.ip",
}


class BrokerConfig:
    """Validated broker settings. Kafka's names that Ottla does not implement are accepted and
    reported at start (`report_not_applied_broker_configs`); names Kafka does not know either
    are rejected, so typos do not pass silently.

    Three layers, Kafka's order of precedence: this broker's dynamic configs, the cluster-wide
    dynamic defaults (both replaced at runtime by `set_dynamic`), the static ones it started with.
    """

    def __init__(self, overrides: Mapping[str, Any] | None = None):
        self.dynamic: dict[str, Any] = {}
        self.dynamic_default: dict[str, Any] = {}
        self.overrides: dict[str, Any] = {}
        # Kafka's names Ottla has no behaviour for (config_names.py), as given: DescribeConfigs lists them.
        self.not_implemented: dict[str, str] = {}
        for name, raw in (overrides or {}).items():
            definition = BROKER_CONFIGS.get(name)
            if definition is None:
                if not is_kafka_broker_config(name):
                    raise ConfigError(f"unknown broker config {name!r}")
                self.not_implemented[name] = str(raw)
                continue
            self.overrides[name] = definition.coerce(raw)
        ids = {self.overrides[n] for n in ("broker.id", "node.id") if n in self.overrides}
        if len(ids) > 1:
            raise ConfigError("broker.id and node.id must have the same value when both are set")
        if "password.encoder.old.secret" in self.overrides and "password.encoder.secret" not in self.overrides:
            # Kafka fails at start too: the passwords decrypted with the old secret cannot be encrypted again.
            raise ConfigError("password.encoder.old.secret is set without password.encoder.secret")

    def __getitem__(self, name: str) -> Any:
        for layer in (self.dynamic, self.dynamic_default, self.overrides):
            if name in layer:
                return layer[name]
        return self._derived_default(name)

    def set_dynamic(self, per_broker: Mapping[str, Any], default: Mapping[str, Any]) -> None:
        """Replace both dynamic layers with values already checked by `coerce_dynamic`."""
        self.dynamic, self.dynamic_default = dict(per_broker), dict(default)

    def _derived_default(self, name: str) -> Any:
        if name == "log.roll.ms":
            return self["log.roll.hours"] * 3600 * 1000
        if name == "log.retention.ms":
            if "log.retention.minutes" in self.overrides:
                return self.overrides["log.retention.minutes"] * 60 * 1000
            return self["log.retention.hours"] * 3600 * 1000
        if name in ("broker.id", "node.id"):
            synonym = "node.id" if name == "broker.id" else "broker.id"
            return self.overrides.get(synonym, BROKER_CONFIGS[name].default)
        if name == "zookeeper.connection.timeout.ms":
            return self["zookeeper.session.timeout.ms"]
        if name == "log.flush.interval.ms":
            return self["log.flush.scheduler.interval.ms"]
        return BROKER_CONFIGS[name].default

    def topic_defaults(self) -> dict[str, Any]:
        """Topic config values a topic gets when it sets nothing itself."""
        values = {}
        for name, definition in TOPIC_CONFIGS.items():
            synonym = TOPIC_TO_BROKER_SYNONYM.get(name)
            values[name] = self[synonym] if synonym else definition.default
        return values

    @staticmethod
    def parse_cli(pairs: list[str]) -> dict[str, str]:
        """Turn `key=value` strings from the command line into a mapping, with clear errors."""
        result = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--config expects key=value, got {pair!r}")
            result[key.strip()] = value.strip()
        return result


def coerce_dynamic(configs: Mapping[str, Any], per_broker: bool = True) -> dict[str, Any]:
    """Check dynamic broker configs as Kafka's DynamicBrokerConfig.validateConfigs does;
    ConfigError carries Kafka's message (the names as a Scala Set). A listener's security
    configs (`listener.name.<l>.ssl.keystore.password`, ...) are taken per broker, as strings."""
    listener = {name for name in configs if listener_security_config(name) is not None}
    static = sorted(set(configs) - DYNAMIC_BROKER_CONFIGS - listener - set(LISTENER_SSL_CONFIGS))
    if static:
        raise ConfigError(f"Cannot update these configs dynamically: Set({', '.join(static)})")
    unprefixed = sorted(set(configs) & set(LISTENER_SSL_CONFIGS))
    if unprefixed:
        raise ConfigError("These security configs can be dynamically updated only per-listener using the "
                          f"listener prefix: Set({', '.join(unprefixed)})")
    if listener and not per_broker:
        raise ConfigError("Cannot update these configs at default cluster level, broker id must be specified: "
                          f"Set({', '.join(sorted(listener))})")
    return {name: raw if name in listener else BROKER_CONFIGS[name].coerce(raw) for name, raw in configs.items()}


def report_not_applied_listener_configs(names) -> None:
    """Log, once per name, that a listener's security config is stored but not applied: Ottla
    has no SSL or SASL listener yet. Never the value (it may be a password)."""
    for name in sorted(set(names) - _reported):
        if listener_security_config(name) is not None:
            _reported.add(name)
            _log.warning("broker config %s is accepted and stored but not applied by Ottla: "
                         "it has no SSL or SASL listener", name)


def redacted(configs: Mapping[str, Any]) -> dict[str, Any]:
    """`configs` fit for a log line: sensitive values as Kafka logs a Password, `[hidden]`."""
    return {name: "[hidden]" if is_sensitive(name) else value for name, value in configs.items()}


def render(value: Any) -> str | None:
    """A config value as Kafka prints it (booleans lower case, None stays null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_ROLL = ("log.roll.ms", "log.roll.hours")
_RETENTION = ("log.retention.ms", "log.retention.minutes", "log.retention.hours")
# Kafka's DynamicBrokerConfig.brokerConfigSynonyms: the names one setting goes by, in precedence order.
_SYNONYM_NAMES = {"log.roll.ms": _ROLL, "log.roll.hours": _ROLL,
                  "log.flush.interval.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
                  **{n: _RETENTION for n in _RETENTION}}


def broker_synonyms(config: BrokerConfig, name: str) -> list[tuple[str, str | None, str]]:
    """(name, value, layer) for each place a broker config's value could come from, most
    specific first, as Kafka's `configSynonyms`: every synonym name per layer (dynamic, dynamic
    default, static, default), then everything before `name` itself dropped (describing
    log.retention.ms when only log.retention.hours has a value gives none)."""
    names = _SYNONYM_NAMES.get(name, (name,))
    defaults = {n: BROKER_CONFIGS[n].default for n in names if BROKER_CONFIGS[n].default is not None}
    found = [(n, render(layer[n]), source)
             for layer, source in ((config.dynamic, "dynamic_broker"), (config.dynamic_default, "dynamic_default"),
                                   (config.overrides, "broker"), (defaults, "default"))
             for n in names if n in layer]
    while found and found[0][0] != name:
        found.pop(0)
    return found


def validate_topic_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Check per-topic overrides; raises ConfigError naming the bad key."""
    result = {}
    for name, raw in configs.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise ConfigError(f"unknown topic config {name!r}")
        result[name] = definition.coerce(raw)
    report_not_applied(result)
    return result


class TopicConfig:
    """A topic's effective configuration: its own overrides over the broker's defaults."""

    def __init__(self, broker: BrokerConfig, overrides: Mapping[str, Any] | None = None):
        self.broker = broker
        self.overrides = validate_topic_configs(overrides or {})

    def __getitem__(self, name: str) -> Any:
        if name in self.overrides:
            return self.overrides[name]
        synonym = TOPIC_TO_BROKER_SYNONYM.get(name)
        if synonym is not None:
            return self.broker[synonym]
        return TOPIC_CONFIGS[name].default

    def synonyms(self, name: str) -> list[tuple[str, str | None, str]]:
        """Where the value comes from, most specific first, as Kafka's createTopicConfigEntry:
        the topic's own setting, then the broker synonym's (`broker_synonyms`)."""
        synonym = TOPIC_TO_BROKER_SYNONYM.get(name)
        found = broker_synonyms(self.broker, synonym) if synonym is not None else []
        if name in self.overrides:
            found.insert(0, (name, render(self.overrides[name]), "topic"))
        return found

    def source(self, name: str) -> str:
        """DescribeConfigs source: the first synonym's layer, else the default."""
        found = self.synonyms(name)
        return found[0][2] if found else "default"
