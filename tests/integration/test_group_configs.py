"""GROUP config resources (KIP-848, issue 15) with real admin clients against a real broker:
every group config Kafka 4.1 defines is described with the broker's `group.*` defaults, set
and deleted by IncrementalAlterConfigs and AlterConfigs, checked against the broker's bounds,
kept over a restart, listed by ListConfigResources, and reported as not applied."""

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
from confluent_kafka.error import KafkaError as CKError

KAFKA_41_GROUP_CONFIGS = {
    "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms", "share.session.timeout.ms",
    "share.heartbeat.interval.ms", "share.record.lock.duration.ms", "share.auto.offset.reset",
    "share.isolation.level", "streams.session.timeout.ms", "streams.heartbeat.interval.ms",
    "streams.num.standby.replicas"}


def _describe(admin, group):
    resource = ConfigResource("GROUP", group)
    return {n: (e.value, e.source) for n, e in admin.describe_configs([resource])[resource].result(15).items()}


def _set(admin, group, op=AlterConfigOpType.SET, **configs):
    resource = ConfigResource("GROUP", group, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=op) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(15)


def _refused(admin, group, **configs):
    with pytest.raises(KafkaException) as failed:
        _set(admin, group, **configs)
    return failed.value.args[0].code(), failed.value.args[0].str()


def test_group_configs_are_described_altered_bounded_and_kept(ottla_broker_factory):
    broker = ottla_broker_factory({"group.consumer.session.timeout.ms": 50000,
                                   "group.share.max.record.lock.duration.ms": 40000})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = _describe(admin, "payments")  # no such group yet: Kafka answers all the same
    assert set(described) == KAFKA_41_GROUP_CONFIGS
    assert described["consumer.session.timeout.ms"] == ("50000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert described["consumer.heartbeat.interval.ms"] == ("5000", ConfigSource.DEFAULT_CONFIG.value)
    assert described["share.auto.offset.reset"] == ("latest", ConfigSource.DEFAULT_CONFIG.value)

    _set(admin, "payments", consumer_session_timeout_ms="55000", share_isolation_level="read_committed")
    described = _describe(admin, "payments")
    assert described["consumer.session.timeout.ms"] == ("55000", ConfigSource.GROUP_CONFIG.value)
    assert described["share.isolation.level"] == ("read_committed", ConfigSource.GROUP_CONFIG.value)
    assert _describe(admin, "other")["consumer.session.timeout.ms"][0] == "50000"  # per group

    # Kafka's bounds: the ConfigDef range, the broker's min/max, names Kafka does not define.
    assert _refused(admin, "payments", consumer_session_timeout_ms="70000") == (
        CKError.INVALID_CONFIG, "consumer.session.timeout.ms must be less than or equal to "
                                "group.consumer.max.session.timeout.ms")
    assert _refused(admin, "payments", share_record_lock_duration_ms="45000")[0] == CKError.INVALID_CONFIG
    assert _refused(admin, "payments", share_record_lock_duration_ms="999")[0] == CKError.INVALID_CONFIG
    assert _refused(admin, "payments", share_isolation_level="serializable")[0] == CKError.INVALID_CONFIG
    assert _refused(admin, "payments", session_timeout_ms="30000") == (
        CKError.INVALID_CONFIG, "Unknown group config name: session.timeout.ms")
    assert _describe(admin, "payments")["consumer.session.timeout.ms"][0] == "55000"  # refusals changed nothing

    _set(admin, "payments", AlterConfigOpType.DELETE, share_isolation_level="")
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = _describe(admin, "payments")
    assert described["consumer.session.timeout.ms"] == ("55000", ConfigSource.GROUP_CONFIG.value)
    assert described["share.isolation.level"] == ("read_uncommitted", ConfigSource.DEFAULT_CONFIG.value)
    # Stored but nothing acts on it: said once per name, at the change and again after the restart.
    log = broker.read_stderr()
    assert log.count("group config consumer.session.timeout.ms is accepted and stored but not applied") == 2
    # The broker's default for it is reported too; its bounds are applied (they refused 70000 above).
    assert "broker config group.consumer.session.timeout.ms=50000 is accepted but not applied" in log
    assert "broker config group.share.max.record.lock.duration.ms" not in log


def test_kafka_python_alters_group_configs_with_the_legacy_form_and_lists_them(ottla_broker):
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    try:
        altered = admin.alter_configs([KPConfigResource(ConfigResourceType.GROUP, "streams-app",
                                                        configs={"streams.num.standby.replicas": "2"})],
                                      incremental=False)  # the legacy whole-set AlterConfigs
        too_many = admin.alter_configs([KPConfigResource(ConfigResourceType.GROUP, "streams-app",
                                                         configs={"streams.num.standby.replicas": "3"})],
                                       incremental=False)  # above group.streams.max.standby.replicas (2)
        described = admin.describe_configs([KPConfigResource(ConfigResourceType.GROUP, "streams-app")],
                                           config_filter="all")["group"]["streams-app"]
        listed = admin.list_config_resources(["GROUP"])
    finally:
        admin.close()
    assert altered == {"group": {"streams-app": "OK"}}
    assert too_many["group"]["streams-app"].startswith("[Error 40] InvalidConfigurationError")
    assert described["streams.num.standby.replicas"]["value"] == "2"
    assert described["streams.num.standby.replicas"]["config_source"] == "DYNAMIC_GROUP_CONFIG"
    assert listed["group"] == ["streams-app"]
