"""Admin behaviours tools rely on, checked with real admin clients against a real broker."""

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic


def _admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _topic_config(admin, topic, name):
    resource = ConfigResource("TOPIC", topic)
    return admin.describe_configs([resource])[resource].result(15)[name].value


def _incremental(admin, topic, name, op, value):
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op)])
    admin.incremental_alter_configs([resource])[resource].result(15)


def test_append_and_subtract_start_from_the_current_value_default_included(ottla_broker):
    admin = _admin(ottla_broker.bootstrap)
    admin.create_topics([NewTopic("policies", 1, 1)])["policies"].result(15)
    _incremental(admin, "policies", "cleanup.policy", AlterConfigOpType.APPEND, "compact")
    assert _topic_config(admin, "policies", "cleanup.policy") == "delete,compact"
    _incremental(admin, "policies", "cleanup.policy", AlterConfigOpType.SUBTRACT, "delete")
    assert _topic_config(admin, "policies", "cleanup.policy") == "compact"
    _incremental(admin, "policies", "cleanup.policy", AlterConfigOpType.SUBTRACT, "compact")
    assert _topic_config(admin, "policies", "cleanup.policy") == ""


def test_every_topic_config_kafka_defines_is_accepted_and_described(ottla_broker):
    """max.compaction.lag.ms and friends: stored and described; the broker logs them once as not applied."""
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    configs = {"max.compaction.lag.ms": "3600000", "unclean.leader.election.enable": "true",
               "follower.replication.throttled.replicas": "*", "segment.jitter.ms": "10"}
    admin.create_topics([KPNewTopic("kafka-configs", 1, 1, topic_configs=configs)])
    admin.create_topics([KPNewTopic("kafka-configs-2", 1, 1, topic_configs={"max.compaction.lag.ms": "1000"})])
    described = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "kafka-configs")],
                                       config_filter="all")["topic"]["kafka-configs"]
    admin.close()
    for name, value in configs.items():
        assert (described[name]["value"], described[name]["config_source"]) == (value, "DYNAMIC_TOPIC_CONFIG")
    assert described["remote.storage.enable"]["value"] == "false"
    assert ottla_broker.read_stderr().count(
        "topic config max.compaction.lag.ms is accepted and stored but not applied") == 1
