"""The names of Kafka 3.9's broker configs that Ottla does not implement, and which of Kafka's
configs are passwords (DescribeConfigs reports them sensitive, with no value) or a listener's
security settings (changed per broker at runtime, KIP-226).

Taken from the ConfigDefs Kafka's `KafkaConfig` is made of (`ServerConfigs`,
`SocketServerConfigs`, `ServerLogConfigs`, `ReplicationConfigs`, `ZkConfigs`, `KRaftConfigs`,
the group, transaction, cleaner, quota, metrics and security ones) less those Ottla has. A name here is accepted
at start with one warning that it has no effect, so a Kafka `server.properties` runs; a name
Kafka does not know either is refused, so a typo does not pass (Kafka would warn and go on).
"""

from __future__ import annotations

import re

__all__ = ["is_dynamic_password", "is_kafka_broker_config", "is_sensitive", "listener_security_config"]

KAFKA_BROKER_CONFIGS_NOT_IMPLEMENTED = frozenset({
    # ServerConfigs
    "num.io.threads", "background.threads", "num.replica.alter.log.dirs.threads",
    "request.timeout.ms", "socket.connection.setup.timeout.ms", "socket.connection.setup.timeout.max.ms",
    "authorizer.class.name", "early.start.listeners", "compression.gzip.level",
    "compression.lz4.level", "compression.zstd.level",
    "broker.id.generation.enable", "reserved.broker.max.id", "broker.heartbeat.interval.ms",
    "broker.session.timeout.ms",
    # SocketServerConfigs
    "listeners", "advertised.listeners", "listener.security.protocol.map", "socket.listen.backlog.size",
    "max.connections.per.ip.overrides", "max.connection.creation.rate", "connection.failed.authentication.delay.ms",
    "queued.max.requests", "num.network.threads",
    # ServerLogConfigs
    "log.dir", "log.dirs", "log.roll.jitter.ms", "log.roll.jitter.hours", "log.segment.delete.delay.ms",
    "log.flush.start.offset.checkpoint.interval.ms", "log.preallocate", "log.message.format.version",
    "log.message.timestamp.difference.max.ms", "log.message.downconversion.enable",
    "num.recovery.threads.per.data.dir", "create.topic.policy.class.name", "alter.config.policy.class.name",
    "log.initial.task.delay.ms", "log.dir.failure.timeout.ms", "log.local.retention.ms", "log.local.retention.bytes",
    # ReplicationConfigs
    "controller.socket.timeout.ms", "replica.socket.receive.buffer.bytes", "num.replica.fetchers",
    "fetch.purgatory.purge.interval.requests", "producer.purgatory.purge.interval.requests",
    "delete.records.purgatory.purge.interval.requests", "inter.broker.protocol.version",
    "security.inter.broker.protocol", "inter.broker.listener.name", "replica.selector.class",
    # ZkConfigs
    "zookeeper.set.acl", "zookeeper.max.in.flight.requests", "zookeeper.ssl.client.enable",
    "zookeeper.clientCnxnSocket", "zookeeper.ssl.keystore.location", "zookeeper.ssl.keystore.password",
    "zookeeper.ssl.keystore.type", "zookeeper.ssl.truststore.location", "zookeeper.ssl.truststore.password",
    "zookeeper.ssl.truststore.type", "zookeeper.ssl.protocol", "zookeeper.ssl.enabled.protocols",
    "zookeeper.ssl.cipher.suites", "zookeeper.ssl.endpoint.identification.algorithm", "zookeeper.ssl.crl.enable",
    "zookeeper.ssl.ocsp.enable", "zookeeper.metadata.migration.enable",
    # KRaftConfigs
    "process.roles", "controller.listener.names", "controller.quorum.voters", "controller.quorum.bootstrap.servers",
    "controller.quorum.election.timeout.ms", "controller.quorum.fetch.timeout.ms",
    "controller.quorum.election.backoff.max.ms", "controller.quorum.append.linger.ms",
    "controller.quorum.request.timeout.ms", "controller.quorum.retry.backoff.ms", "metadata.log.dir",
    "metadata.log.segment.bytes", "metadata.log.segment.ms", "metadata.max.retention.bytes",
    "metadata.max.retention.ms", "metadata.max.idle.interval.ms", "metadata.log.max.record.bytes.between.snapshots",
    "metadata.log.max.snapshot.interval.ms", "initial.broker.registration.timeout.ms",
    # group coordinator
    "group.coordinator.rebalance.protocols", "group.coordinator.new.enable", "group.coordinator.threads",
    "group.consumer.max.size", "group.consumer.assignors", "group.consumer.migration.policy",
    "offsets.load.buffer.size", "offsets.commit.timeout.ms", "offsets.commit.required.acks",
    "offsets.topic.compression.codec",
    # transaction coordinator
    "transaction.state.log.load.buffer.size",
    "transaction.partition.verification.enable",
    # log cleaner
    "log.cleaner.io.buffer.size",
    # quotas
    "client.quota.callback.class", "quota.window.num", "quota.window.size.seconds",
    "replication.quota.window.num", "replication.quota.window.size.seconds",
    "alter.log.dirs.replication.quota.window.num", "alter.log.dirs.replication.quota.window.size.seconds",
    "controller.quota.window.num", "controller.quota.window.size.seconds",
    "leader.replication.throttled.rate", "follower.replication.throttled.rate",
    "replica.alter.log.dirs.io.max.bytes.per.second",
    # metrics
    "metric.reporters", "metrics.num.samples", "metrics.sample.window.ms", "metrics.recording.level",
    "auto.include.jmx.reporter", "kafka.metrics.reporters", "kafka.metrics.polling.interval.secs",
    # delegation tokens
    "delegation.token.master.key", "delegation.token.secret.key", "delegation.token.max.lifetime.ms",
    "delegation.token.expiry.time.ms", "delegation.token.expiry.check.interval.ms",
    # security (besides the ssl.* and sasl.* families below)
    "principal.builder.class", "security.providers", "connections.max.reauth.ms",
})

# Families whose members Kafka defines by the dozen (TLS, SASL, tiered storage) or, for
# `listener.name.`, per listener: any name in them is taken for Kafka's.
KAFKA_BROKER_CONFIG_PREFIXES = ("ssl.", "sasl.", "listener.name.", "remote.log.")


def is_kafka_broker_config(name: str) -> bool:
    """True for a Kafka broker config name that Ottla does not implement (see the module's text)."""
    return name in KAFKA_BROKER_CONFIGS_NOT_IMPLEMENTED or name.startswith(KAFKA_BROKER_CONFIG_PREFIXES)


# Kafka's configs of type PASSWORD (SslConfigs, SaslConfigs, ZkConfigs, the password encoder and
# delegation tokens). DescribeConfigs reports them is_sensitive with a null value, synonyms too
# (Kafka's KafkaConfig.maybeSensitive), and Ottla never writes their values to its logs.
PASSWORD_CONFIGS = frozenset({
    "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password", "ssl.keystore.key",
    "ssl.keystore.certificate.chain", "ssl.truststore.certificates", "sasl.jaas.config",
    "zookeeper.ssl.keystore.password", "zookeeper.ssl.truststore.password",
    "password.encoder.secret", "password.encoder.old.secret",
    "delegation.token.master.key", "delegation.token.secret.key",
})

# What a listener's own settings may change at runtime (KIP-226), as Kafka's DynamicBrokerConfig:
# the reconfigurable SSL configs (SslConfigs.RECONFIGURABLE_CONFIGS), which Kafka refuses without
# the `listener.name.<listener>.` prefix, and the SASL settings given per listener and mechanism
# (`listener.name.<listener>.<mechanism>.sasl.jaas.config`, ListenerMechanismConfigs). With their
# DescribeConfigs types (ConfigType: 2 STRING, 5 LONG, 8 CLASS, 9 PASSWORD).
LISTENER_SSL_CONFIGS = {
    "ssl.keystore.type": 2, "ssl.keystore.location": 2, "ssl.keystore.password": 9, "ssl.key.password": 9,
    "ssl.truststore.type": 2, "ssl.truststore.location": 2, "ssl.truststore.password": 9,
    "ssl.keystore.certificate.chain": 9, "ssl.keystore.key": 9, "ssl.truststore.certificates": 9,
}
LISTENER_MECHANISM_CONFIGS = {
    "sasl.jaas.config": 9, "sasl.login.callback.handler.class": 8, "sasl.login.class": 8,
    "sasl.server.callback.handler.class": 8, "connections.max.reauth.ms": 5,
}
_LISTENER_PREFIX = re.compile(r"listener\.name\.[^.]*\.(.*)")


def listener_security_config(name: str) -> str | None:
    """The base name of a per-listener security config (`listener.name.sasl_ssl.ssl.key.password`
    -> `ssl.key.password`, `listener.name.x.plain.sasl.jaas.config` -> `sasl.jaas.config`),
    else None."""
    match = _LISTENER_PREFIX.fullmatch(name)
    if match is None:
        return None
    base = match.group(1)
    if base in LISTENER_SSL_CONFIGS:
        return base
    return next((config for config in LISTENER_MECHANISM_CONFIGS if base.endswith("." + config)), None)


def is_dynamic_password(name: str) -> bool:
    """A dynamic broker config that is stored encrypted (Kafka's `isPasswordConfig`): a listener's
    PASSWORD-typed security config, the only passwords that may be set at runtime."""
    base = listener_security_config(name)
    return base is not None and {**LISTENER_SSL_CONFIGS, **LISTENER_MECHANISM_CONFIGS}[base] == 9


def is_sensitive(name: str) -> bool:
    """Kafka's sensitivity of a broker or topic config name: a PASSWORD-typed config, under its
    own name or a listener's (`listener.name.<l>.[<mechanism>.]<config>`), or any `*.password`."""
    match = _LISTENER_PREFIX.fullmatch(name)
    base = match.group(1) if match is not None else name
    return (name.endswith(".password") or base in PASSWORD_CONFIGS
            or any(base.endswith("." + config) for config in PASSWORD_CONFIGS))
