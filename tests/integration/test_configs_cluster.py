"""Configs on a 3-broker cluster answer from ZooKeeper, as Kafka's ZK mode: a topic's configs
altered on a broker that holds no replica are described by another broker that holds none,
written as Kafka writes them (`/config/topics/<t>` and a `/config/changes` notification), and
applied by the leader; dynamic broker configs set on one broker reach the leader too."""

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from confluent_kafka.error import KafkaError as CKError
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from ottla.protocol.build import make, nested
from ottla.testing import cluster
from tests.waiting import wait_for
from tests.wire import roundtrip

INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CONFIGS, TOPIC, BROKER, GROUP = 44, 32, 2, 4, 32


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, root=tmp_path_factory.mktemp("configs")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


@pytest.fixture
def zk(three, zk_client):
    return zk_client(three.connect)


def _alter(sock, resource_type, name, **configs):
    """IncrementalAlterConfigs SET on the wire: to exactly this broker (clients pick one)."""
    schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    entries = tuple(make(nested(schema, "AlterableConfig"), name=k.replace("_", "."), config_operation=0, value=v)
                    for k, v in configs.items())
    _, response = roundtrip(sock, make(schema, validate_only=False, resources=(
        make(nested(schema, "AlterConfigsResource"), resource_type=resource_type, resource_name=name,
             configs=entries),)))
    return response.responses[0]


def _describe(sock, resource_type, name):
    schema = load_request_schema(DESCRIBE_CONFIGS, 4)
    _, response = roundtrip(sock, make(schema, include_synonyms=True, include_documentation=False, resources=(
        make(nested(schema, "DescribeConfigsResource"), resource_type=resource_type, resource_name=name,
             configuration_keys=None),)))
    result = response.results[0]
    return result.error_code, {c.name: (c.value, c.config_source) for c in result.configs}


def _delivery_error(bootstrap, topic, size):
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000, "retries": 0})
    producer.produce(topic, b"x" * size, partition=0, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0
    return errors[0]


def _local_configs(broker, topic):
    """The configs in a broker's local topic catalog (`.topics/<id>.json`), None without one."""
    for path in (broker.data_dir / ".topics").glob("*.json"):
        meta = json.loads(path.read_text())
        if meta["name"] == topic:
            return meta["configs"]
    return None


def _rejected(bootstrap, topic, size):
    err = _delivery_error(bootstrap, topic, size)
    return err is not None and err.code() == CKError.MSG_SIZE_TOO_LARGE


def test_topic_configs_altered_anywhere_are_described_anywhere_and_applied_by_the_leader(three, zk, raw_connection):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("cfg", num_partitions=1, replica_assignment=[[1]])])["cfg"].result(60)
    on_2, on_3 = raw_connection(three.brokers[2].bootstrap), raw_connection(three.brokers[3].bootstrap)
    wait_for(lambda: _describe(on_2, TOPIC, "cfg")[0] == ErrorCode.none, what="cfg known to broker 2")
    wait_for(lambda: _delivery_error(three.bootstrap, "cfg", 200_000) is None, what="a 200 KB record accepted")

    # Broker 3 holds no replica: it writes the cluster's configs, broker 2 (none either) reads them.
    assert _alter(on_3, TOPIC, "cfg", max_message_bytes="100000").error_code == ErrorCode.none
    assert _describe(on_2, TOPIC, "cfg")[1]["max.message.bytes"] == ("100000", 1)  # TOPIC_CONFIG
    assert json.loads(zk.get("/config/topics/cfg")[0]) == {"version": 1, "config": {"max.message.bytes": "100000"}}
    notes = [json.loads(zk.get(f"/config/changes/{n}")[0]) for n in zk.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "topics/cfg"} in notes
    wait_for(lambda: _rejected(three.bootstrap, "cfg", 200_000), what="the leader to refuse 200 KB")

    # Both clients, whichever broker they ask.
    resource = ConfigResource("TOPIC", "cfg", incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    via_2 = AdminClient({"bootstrap.servers": three.brokers[2].bootstrap})
    via_2.incremental_alter_configs([resource])[resource].result(30)
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    kp = KafkaAdminClient(bootstrap_servers=three.brokers[3].bootstrap)
    try:
        described = kp.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "cfg")])["topic"]["cfg"]
    finally:
        kp.close()
    assert {n: c["value"] for n, c in described.items()} == {"max.message.bytes": "100000", "retention.ms": "3600000"}
    # The leader's local catalog (what its logs run on) took both changes.
    wait_for(lambda: _local_configs(three.brokers[1], "cfg") == {"max.message.bytes": 100000, "retention.ms": 3600000},
             what="broker 1's catalog to hold both configs")
    assert _local_configs(three.brokers[2], "cfg") is None  # no replica there, no local topic


def test_dynamic_broker_default_set_on_one_broker_reaches_the_leader(three, zk, raw_connection):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("dflt", num_partitions=1, replica_assignment=[[1]])])["dflt"].result(60)
    wait_for(lambda: _delivery_error(three.bootstrap, "dflt", 200_000) is None, what="a 200 KB record accepted")
    on_2 = raw_connection(three.brokers[2].bootstrap)
    assert _alter(on_2, BROKER, "", message_max_bytes="100000").error_code == ErrorCode.none
    assert json.loads(zk.get("/config/brokers/<default>")[0])["config"] == {"message.max.bytes": "100000"}
    wait_for(lambda: _rejected(three.bootstrap, "dflt", 200_000), what="the leader to refuse 200 KB")
    on_1 = raw_connection(three.brokers[1].bootstrap)
    assert _describe(on_1, BROKER, "1")[1]["message.max.bytes"] == ("100000", 3)  # DYNAMIC_DEFAULT_BROKER_CONFIG
    # Broker 1's own setting wins over the default; another broker's id is refused.
    assert _alter(on_2, BROKER, "1", message_max_bytes="300000").error_code == ErrorCode.invalid_request
    assert _alter(on_1, BROKER, "1", message_max_bytes="300000").error_code == ErrorCode.none
    assert json.loads(zk.get("/config/brokers/1")[0])["config"] == {"message.max.bytes": "300000"}
    wait_for(lambda: _delivery_error(three.bootstrap, "dflt", 200_000) is None, what="200 KB accepted again")
    assert _describe(on_2, BROKER, "2")[1]["message.max.bytes"] == ("100000", 3)


def test_a_broker_that_was_away_applies_what_changed_meanwhile(three, raw_connection):
    """Changes made while a replica's broker is stopped reach it when it starts: it reads
    the store at start, not only the notifications it sees while running."""
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("away", num_partitions=1, replica_assignment=[[3]])])["away"].result(60)
    on_2 = raw_connection(three.brokers[2].bootstrap)
    wait_for(lambda: _describe(on_2, TOPIC, "away")[0] == ErrorCode.none, what="away known to broker 2")
    wait_for(lambda: _local_configs(three.brokers[3], "away") == {}, what="broker 3's replica of away")
    three.brokers[3].stop(timeout=180)  # controlled shutdown: its RF=1 partition cannot move
    assert _alter(on_2, TOPIC, "away", retention_ms="7200000").error_code == ErrorCode.none
    assert _alter(on_2, BROKER, "", log_retention_bytes="123456").error_code == ErrorCode.none
    three.brokers[3].start()
    wait_for(lambda: _local_configs(three.brokers[3], "away") == {"retention.ms": 7200000},
             what="broker 3's catalog to take the change made while it was away")
    on_3 = raw_connection(three.brokers[3].bootstrap)
    assert _describe(on_3, BROKER, "3")[1]["log.retention.bytes"] == ("123456", 3)


def test_group_configs_set_on_one_broker_are_described_by_another(three, zk, raw_connection):
    """GROUP configs (KIP-848) are cluster-wide, as in Kafka 4's metadata log: `/config/groups/<g>`
    written by one broker, read by any, whether or not the group exists anywhere."""
    on_1, on_3 = raw_connection(three.brokers[1].bootstrap), raw_connection(three.brokers[3].bootstrap)
    assert _alter(on_1, GROUP, "billing", consumer_heartbeat_interval_ms="6000").error_code == ErrorCode.none
    assert json.loads(zk.get("/config/groups/billing")[0]) == {
        "version": 1, "config": {"consumer.heartbeat.interval.ms": "6000"}}
    assert _describe(on_3, GROUP, "billing")[1]["consumer.heartbeat.interval.ms"] == ("6000", 8)  # GROUP_CONFIG
    assert _describe(on_3, GROUP, "payroll")[1]["consumer.heartbeat.interval.ms"] == ("5000", 5)  # DEFAULT_CONFIG
    assert _alter(on_3, GROUP, "billing", consumer_heartbeat_interval_ms="16000").error_code == ErrorCode.invalid_config
    assert _list_groups(on_3) == ["billing"]  # ListConfigResources: the groups that have configs
    assert _delete(on_3, GROUP, "billing", "consumer.heartbeat.interval.ms").error_code == ErrorCode.none
    assert _list_groups(on_1) == []
    assert _describe(on_1, GROUP, "billing")[1]["consumer.heartbeat.interval.ms"] == ("5000", 5)


def _delete(sock, resource_type, name, config):
    schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    entry = make(nested(schema, "AlterableConfig"), name=config, config_operation=1, value=None)
    _, response = roundtrip(sock, make(schema, validate_only=False, resources=(
        make(nested(schema, "AlterConfigsResource"), resource_type=resource_type, resource_name=name,
             configs=(entry,)),)))
    return response.responses[0]


def _list_groups(sock):
    schema = load_request_schema(74, 1)
    _, response = roundtrip(sock, make(schema, resource_types=(GROUP,)))
    return [r.resource_name for r in response.config_resources]


def test_a_listeners_password_is_encrypted_in_zookeeper_and_rotated_at_start(three, zk, raw_connection):
    """As Kafka's ZK mode: refused while the broker has no password.encoder.secret; with one,
    `/config/brokers/<id>` holds only the encrypted form, DescribeConfigs no value; refused on
    the cluster default. Restarted with a new secret and the former one as the old secret, the
    broker encrypts it again with the new one and still has it."""
    from ottla.errors import ConfigError
    from ottla.password_encoder import PasswordEncoder

    listener = "listener.name.plaintext.ssl.keystore.password"
    handle = three.brokers[3]
    refused = _alter(raw_connection(handle.bootstrap), BROKER, "3", **{listener: "zk-secret"})
    assert (refused.error_code, refused.error_message) == (ErrorCode.invalid_request, (
        "Invalid config value for resource ConfigResource(type=BROKER, name='3'): Password encoder secret not "
        "configured"))
    assert zk.exists("/config/brokers/3") is None or b"zk-secret" not in zk.get("/config/brokers/3")[0]

    handle.config["password.encoder.secret"] = "first-secret"
    handle.restart()
    on_3 = raw_connection(handle.bootstrap)
    assert _alter(on_3, BROKER, "3", **{listener: "zk-secret"}).error_code == ErrorCode.none
    data = zk.get("/config/brokers/3")[0]
    assert b"zk-secret" not in data
    assert PasswordEncoder("first-secret").decode(json.loads(data)["config"][listener]) == "zk-secret"
    assert _describe(on_3, BROKER, "3")[1][listener] == (None, 2)  # DYNAMIC_BROKER_CONFIG, no value
    refused = _alter(on_3, BROKER, "", **{listener: "x"})
    assert refused.error_code == ErrorCode.invalid_request
    assert "broker id must be specified" in refused.error_message

    handle.config.update({"password.encoder.secret": "second-secret", "password.encoder.old.secret": "first-secret"})
    handle.restart()
    data = zk.get("/config/brokers/3")[0]
    stored = json.loads(data)["config"][listener]
    assert b"zk-secret" not in data and PasswordEncoder("second-secret").decode(stored) == "zk-secret"
    with pytest.raises(ConfigError):
        PasswordEncoder("first-secret").decode(stored)
    assert _describe(raw_connection(handle.bootstrap), BROKER, "3")[1][listener] == (None, 2)
    assert "could not be decoded" not in handle.read_stderr()
