"""Issue 11: a config Ottla accepts under Kafka's name but does not act on is reported, one
warning line each, never silently ignored."""

from __future__ import annotations

import logging

from ottla import config as config_module
from ottla.config import BrokerConfig, report_not_applied_broker_configs, validate_topic_configs


def test_broker_configs_set_but_not_applied_are_reported_at_start(caplog):
    config = BrokerConfig({"min.insync.replicas": 2, "fetch.max.bytes": 1000, "offsets.topic.replication.factor": 1,
                           "transaction.state.log.replication.factor": 1, "num.partitions": 3})
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        reported = report_not_applied_broker_configs(config)
    assert reported == ["fetch.max.bytes", "min.insync.replicas", "offsets.topic.replication.factor",
                        "transaction.state.log.replication.factor"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all("not applied" in line for line in lines)
    assert any(line.startswith("broker config min.insync.replicas=2 ") for line in lines)


def test_topic_configs_not_applied_are_reported_once(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "_reported", set())
    with caplog.at_level(logging.WARNING, logger="ottla.config"):
        validate_topic_configs({"min.insync.replicas": "2", "file.delete.delay.ms": "0"})
        validate_topic_configs({"min.insync.replicas": "2"})
    lines = sorted(r.getMessage() for r in caplog.records)
    assert lines == ["topic config file.delete.delay.ms is accepted and stored but not applied by Ottla",
                     "topic config min.insync.replicas is accepted and stored but not applied by Ottla"]
