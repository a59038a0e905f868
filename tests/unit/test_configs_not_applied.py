"""Issue 11: a config Ottla accepts under Kafka's name but does not act on is reported, one
warning line each, never silently ignored."""

from __future__ import annotations

import logging

from ottla import config as config_module
from ottla.config import BrokerConfig, report_not_applied_broker_configs, validate_topic_configs


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
