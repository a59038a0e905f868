"""Issue 11: a config Ottla accepts under Kafka's name but does not act on is reported, one
warning line each, never silently ignored."""

from __future__ import annotations

import logging

import pytest

from ottla import config as config_module
from ottla.config import BrokerConfig, report_not_applied_broker_configs, validate_topic_configs
from ottla.errors import ConfigError


def test_broker_configs_set_but_not_applied_are_reported_at_start(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "NOT_APPLIED_BROKER_CONFIGS", {"num.partitions": "for this test"})
    config = BrokerConfig({"num.partitions": 3})
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        reported = report_not_applied_broker_configs(config)
    assert reported == ["num.partitions"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["broker config num.partitions=3 is accepted but not applied by Ottla: for this test"]


def test_configs_that_now_work_are_not_reported_as_not_applied(caplog):
    """min.insync.replicas (replication), fetch.max.bytes (Fetch bounds) and the internal topics'
    replication factors (coordinators on the cluster) are applied: no warning may say otherwise."""
    config = BrokerConfig({"min.insync.replicas": 2, "fetch.max.bytes": 1000, "offsets.topic.replication.factor": 1,
                           "transaction.state.log.replication.factor": 1})
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        assert report_not_applied_broker_configs(config) == []
    assert caplog.records == []


def test_topic_configs_not_applied_are_reported_once(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "_reported", set())
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        validate_topic_configs({"min.insync.replicas": "2", "file.delete.delay.ms": "0"})
        validate_topic_configs({"file.delete.delay.ms": "0"})
    lines = sorted(r.getMessage() for r in caplog.records)
    assert lines == ["topic config file.delete.delay.ms is accepted and stored but not applied by Ottla"]


def test_kafka_broker_configs_ottla_does_not_implement_are_accepted_with_one_warning_each(caplog):
    """A Kafka server.properties starts: each Kafka name Ottla has no behaviour for is one
    warning at start, named without its value (it may be a password), as Kafka warns of names
    it does not know."""
    config = BrokerConfig({"num.network.threads": "3", "log.dirs": "/var/lib/kafka",
                           "ssl.keystore.password": "secret", "num.partitions": "2"})
    assert config["num.partitions"] == 2
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        reported = report_not_applied_broker_configs(config)
    assert reported == ["log.dirs", "num.network.threads", "ssl.keystore.password"]
    assert [r.getMessage() for r in caplog.records] == [
        f"broker config {name} is a Kafka config Ottla does not implement: it is ignored" for name in reported]
    assert "secret" not in caplog.text


def test_names_kafka_does_not_know_are_still_refused():
    """Kafka would only warn; a typo that passes silently is worse than a broker that does not start."""
    with pytest.raises(ConfigError, match="unknown broker config 'num.netwrok.threads'"):
        BrokerConfig({"num.netwrok.threads": "3"})


def test_internal_topic_replication_factors_a_single_node_cannot_apply_are_reported(caplog):
    """A single node (no zookeeper.connect) keeps one replica of its internal topics whatever
    the factor says; set above 1 there, the factor is reported, not silently dropped. In a
    cluster it applies (test_coordinators_cluster.py) and nothing is said."""
    factors = {"offsets.topic.replication.factor": 3, "transaction.state.log.replication.factor": 2}
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        reported = report_not_applied_broker_configs(BrokerConfig(factors))
    assert reported == sorted(factors)
    assert [r.getMessage() for r in caplog.records] == [
        f"broker config {name}={value} is not applied: a single node (no zookeeper.connect) keeps one replica of "
        f"its internal topics" for name, value in sorted(factors.items())]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        assert report_not_applied_broker_configs(BrokerConfig({**factors, "zookeeper.connect": "localhost:2181"})) == []
    assert caplog.records == []
