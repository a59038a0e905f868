"""Kafka's GroupConfig validation (group_config.py) against the broker's group.* bounds."""

import pytest

from ottla.config import BrokerConfig
from ottla.errors import ConfigError
from ottla.group_config import GroupConfig, validate_group_configs


def test_a_session_timeout_must_exceed_its_heartbeat_interval():
    broker = BrokerConfig({"group.consumer.min.session.timeout.ms": 1000, "group.consumer.max.heartbeat.interval.ms": 9000})
    assert validate_group_configs({"consumer.session.timeout.ms": "8001",
                                   "consumer.heartbeat.interval.ms": "8000"}, broker)["consumer.session.timeout.ms"] == 8001
    with pytest.raises(ConfigError, match="consumer.session.timeout.ms must be greater than "
                                          "consumer.heartbeat.interval.ms"):
        validate_group_configs({"consumer.session.timeout.ms": "8000", "consumer.heartbeat.interval.ms": "8000"}, broker)


def test_values_are_checked_against_the_broker_bounds_and_kafkas_types():
    broker = BrokerConfig({"group.share.min.heartbeat.interval.ms": 7000})
    with pytest.raises(ConfigError, match="share.heartbeat.interval.ms must be greater than or equal to "
                                          "group.share.min.heartbeat.interval.ms"):
        validate_group_configs({}, broker)  # the default (5000) is below this broker's minimum
    fine = BrokerConfig()
    for bad in ({"consumer.session.timeout.ms": "2147483648"}, {"streams.num.standby.replicas": "-1"},
                {"share.auto.offset.reset": "by_duration:-PT1H"}, {"share.auto.offset.reset": "none"}):
        with pytest.raises(ConfigError):
            validate_group_configs(bad, fine)
    assert validate_group_configs({"share.auto.offset.reset": "by_duration:P1DT2H30M"}, fine)


def test_defaults_come_from_the_broker_and_synonyms_say_where():
    broker = BrokerConfig({"group.streams.num.standby.replicas": 1})
    config = GroupConfig(broker, {"streams.heartbeat.interval.ms": "6000"})
    assert config["streams.num.standby.replicas"] == 1
    assert config.synonyms("streams.num.standby.replicas") == [("group.streams.num.standby.replicas", "1", "broker"),
                                                              ("group.streams.num.standby.replicas", "0", "default")]
    assert config.synonyms("streams.heartbeat.interval.ms")[0] == ("streams.heartbeat.interval.ms", "6000", "group")
    assert config.synonyms("share.isolation.level") == [("share.isolation.level", "read_uncommitted", "default")]
