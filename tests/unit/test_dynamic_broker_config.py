"""Dynamic broker config layers and Kafka's synonym order (DynamicBrokerConfig, configSynonyms)."""

import pytest

from ottla.config import BrokerConfig, ConfigError, TopicConfig, broker_synonyms, coerce_dynamic


def test_precedence_is_per_broker_then_cluster_default_then_static_then_default():
    config = BrokerConfig({"message.max.bytes": 300})
    assert config["message.max.bytes"] == 300
    config.set_dynamic({}, coerce_dynamic({"message.max.bytes": "200"}))
    assert config["message.max.bytes"] == 200
    config.set_dynamic(coerce_dynamic({"message.max.bytes": "100"}), coerce_dynamic({"message.max.bytes": "200"}))
    assert config["message.max.bytes"] == 100
    assert TopicConfig(config)["max.message.bytes"] == 100  # topics follow their broker synonym
    assert TopicConfig(config, {"max.message.bytes": 50})["max.message.bytes"] == 50
    config.set_dynamic({}, {})
    assert config["message.max.bytes"] == 300


def test_synonyms_list_every_layer_in_kafkas_order_and_drop_those_before_the_name():
    config = BrokerConfig({"log.retention.hours": 24})
    # Nothing sets log.retention.ms itself: Kafka drops the hours synonyms before it.
    assert broker_synonyms(config, "log.retention.ms") == []
    assert TopicConfig(config).synonyms("retention.ms") == []
    assert TopicConfig(config).source("retention.ms") == "default"
    assert TopicConfig(config)["retention.ms"] == 24 * 3600 * 1000
    config.set_dynamic(coerce_dynamic({"log.retention.ms": "5"}), coerce_dynamic({"log.retention.ms": "7"}))
    assert broker_synonyms(config, "log.retention.ms") == [
        ("log.retention.ms", "5", "dynamic_broker"), ("log.retention.ms", "7", "dynamic_default"),
        ("log.retention.hours", "24", "broker"), ("log.retention.hours", "168", "default")]
    assert TopicConfig(config, {"retention.ms": 9}).synonyms("retention.ms")[:2] == [
        ("retention.ms", "9", "topic"), ("log.retention.ms", "5", "dynamic_broker")]
    assert TopicConfig(config).source("retention.ms") == "dynamic_broker"


def test_only_configs_applied_at_runtime_are_dynamic():
    with pytest.raises(ConfigError, match=r"Cannot update these configs dynamically: Set\(log.dirs, log.retention.hours\)"):
        coerce_dynamic({"log.retention.hours": "1", "log.dirs": "/x", "message.max.bytes": "5"})
    for name in ("log.cleaner.threads", "num.io.threads", "broker.id"):
        with pytest.raises(ConfigError):
            coerce_dynamic({name: "1"})
    # Cluster-wide in Kafka: the controller takes it (tests/integration/test_controller_cluster.py).
    assert coerce_dynamic({"unclean.leader.election.enable": "true"}) == {"unclean.leader.election.enable": True}
    with pytest.raises(ConfigError, match="invalid value"):
        coerce_dynamic({"message.max.bytes": "-1"})
    assert coerce_dynamic({"log.cleanup.policy": "delete,compact", "max.connections": "9"}) == {
        "log.cleanup.policy": "delete,compact", "max.connections": 9}


def test_passwords_are_sensitive_and_listener_security_configs_are_per_broker():
    from ottla.config import redacted
    from ottla.config_names import is_sensitive, listener_security_config

    for name in ("ssl.keystore.password", "sasl.jaas.config", "ssl.keystore.key", "delegation.token.secret.key",
                 "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config", "listener.name.x.ssl.key.password",
                 "zookeeper.ssl.truststore.password", "any.other.password"):
        assert is_sensitive(name), name
    for name in ("ssl.keystore.location", "retention.ms", "listener.name.x.ssl.truststore.type", "sasl.mechanism"):
        assert not is_sensitive(name), name
    assert listener_security_config("listener.name.sasl_ssl.plain.sasl.jaas.config") == "sasl.jaas.config"
    assert listener_security_config("listener.name.ssl.ssl.truststore.location") == "ssl.truststore.location"
    assert listener_security_config("listener.name.ssl.max.connections") is None
    listener = "listener.name.plaintext.ssl.keystore.password"
    assert coerce_dynamic({listener: "secret"}) == {listener: "secret"}
    with pytest.raises(ConfigError, match=r"at default cluster level, broker id must be specified: Set\(" + listener):
        coerce_dynamic({listener: "secret"}, per_broker=False)
    with pytest.raises(ConfigError, match=r"only per-listener using the listener prefix: Set\(ssl.keystore.password\)"):
        coerce_dynamic({"ssl.keystore.password": "secret"})
    with pytest.raises(ConfigError, match=r"Cannot update these configs dynamically: Set\(sasl.jaas.config\)"):
        coerce_dynamic({"sasl.jaas.config": "x"})
    assert redacted({listener: "secret", "message.max.bytes": 5}) == {listener: "[hidden]", "message.max.bytes": 5}
