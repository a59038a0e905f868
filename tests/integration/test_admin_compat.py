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
