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
    for name in ("log.cleaner.threads", "unclean.leader.election.enable", "num.io.threads", "broker.id"):
        with pytest.raises(ConfigError):
            coerce_dynamic({name: "1"})
    with pytest.raises(ConfigError, match="invalid value"):
        coerce_dynamic({"message.max.bytes": "-1"})
    assert coerce_dynamic({"log.cleanup.policy": "delete,compact", "max.connections": "9"}) == {
        "log.cleanup.policy": "delete,compact", "max.connections": 9}
