"""Admin behaviours tools rely on, checked with real admin clients against a real broker."""

import pytest
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
    """max.compaction.lag.ms (refused before compaction landed) and the configs Ottla does not act on:
    stored and described; the broker logs each of the latter once as not applied."""
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    configs = {"max.compaction.lag.ms": "3600000", "unclean.leader.election.enable": "true",
               "follower.replication.throttled.replicas": "*", "segment.jitter.ms": "10"}
    admin.create_topics([KPNewTopic("kafka-configs", 1, 1, topic_configs=configs)])
    admin.create_topics([KPNewTopic("kafka-configs-2", 1, 1, topic_configs={"segment.jitter.ms": "5"})])
    described = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "kafka-configs")],
                                       config_filter="all")["topic"]["kafka-configs"]
    admin.close()
    for name, value in configs.items():
        assert (described[name]["value"], described[name]["config_source"]) == (value, "DYNAMIC_TOPIC_CONFIG")
    assert described["remote.storage.enable"]["value"] == "false"
    log = ottla_broker.read_stderr()
    assert log.count("topic config segment.jitter.ms is accepted and stored but not applied") == 1
    assert "topic config max.compaction.lag.ms is accepted" not in log  # the cleaner applies it


def test_delete_groups_right_after_a_session_times_out(ottla_broker_factory, raw_connection):
    """A member that stops heartbeating is gone as soon as its session runs out: DeleteGroups
    sent just after the timeout succeeds, as in Kafka (not NON_EMPTY_GROUP until a timer tick).
    Raw frames on connections opened beforehand keep the client's own latency out of it."""
    import time
    from datetime import timedelta

    from kio.schema.errors import ErrorCode

    from ottla.protocol.build import make, nested
    from ottla.protocol.schemas import request_schema
    from tests.wire import roundtrip

    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 0})
    sock, admin_sock = raw_connection(broker.bootstrap), raw_connection(broker.bootstrap)
    join_type = request_schema(11, 5)
    protocol = make(nested(join_type, "JoinGroupRequestProtocol"), name="range", metadata=b"")

    def join(member_id):
        return roundtrip(sock, make(join_type, group_id="expiring", session_timeout=timedelta(seconds=6),
                                    rebalance_timeout=timedelta(seconds=6), member_id=member_id,
                                    group_instance_id=None, protocol_type="consumer", protocols=(protocol,)))[1]

    member = join(join("").member_id).member_id
    sync_type = request_schema(14, 3)
    assignment = make(nested(sync_type, "SyncGroupRequestAssignment"), member_id=member, assignment=b"")
    _, synced = roundtrip(sock, make(sync_type, group_id="expiring", generation_id=1, member_id=member,
                                     group_instance_id=None, assignments=(assignment,)))
    answered = time.monotonic()
    assert synced.error_code == ErrorCode.none
    # The broker set the session deadline before it answered; the member now stays silent past it.
    time.sleep(max(0.0, answered + 6.002 - time.monotonic()))
    _, deleted = roundtrip(admin_sock, request_schema(42, 2)(groups_names=("expiring",)))
    assert deleted.results[0].error_code == ErrorCode.none


def test_authorized_operations_are_reported_as_kafka_without_an_authorizer_does(ottla_broker):
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    admin = _admin(ottla_broker.bootstrap)
    admin.create_topics([NewTopic("ops", 1, 1)])["ops"].result(15)
    topic = admin.describe_topics(TopicCollection(["ops"]), include_authorized_operations=True)["ops"].result(15)
    assert set(topic.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DELETE,
        AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE}
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": ottla_broker.bootstrap, "group.id": "ops-group"})
    consumer.subscribe(["ops"])
    consumer.poll(5)
    group = admin.describe_consumer_groups(["ops-group"], include_authorized_operations=True)["ops-group"].result(15)
    consumer.close()
    assert set(group.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


def test_acl_apis_answer_security_disabled_without_an_authorizer(ottla_broker):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)

    admin = _admin(ottla_broker.bootstrap)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    acl_filter = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    for future in (admin.create_acls([binding])[binding], admin.delete_acls([acl_filter])[acl_filter]):
        with pytest.raises(KafkaException) as failed:
            future.result(15)
        assert failed.value.args[0].code() == KafkaError.SECURITY_DISABLED
    # librdkafka turns a DescribeAcls error into an empty list; kafka-python raises it.
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient
    from kafka.admin import ResourcePatternFilter
    from kafka.admin import ResourceType as KPResourceType
    from kafka.errors import SecurityDisabledError

    # A client of the Kafka 1.x era sends DescribeAcls v0 (removed in Kafka 4.0).
    for api_version in (None, (1, 1, 0)):
        kp_admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap, api_version=api_version)
        pattern = ACLResourcePatternType.ANY if api_version is None else ACLResourcePatternType.LITERAL
        with pytest.raises(SecurityDisabledError):
            kp_admin.describe_acls(ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                                             permission_type=ACLPermissionType.ANY,
                                             resource_pattern=ResourcePatternFilter(KPResourceType.TOPIC, None, pattern)))
        kp_admin.close()


def test_describe_log_dirs_reports_partition_sizes(ottla_broker):
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    admin.create_topics([KPNewTopic("sized", 2, 1)])
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for _ in range(100):
        producer.send("sized", value=b"x" * 1000, partition=1)
    producer.close()
    dirs = admin.describe_log_dirs()
    admin.close()
    sizes = _log_dir_sizes(dirs)
    assert sizes[("sized", 0)] == 0
    assert sizes[("sized", 1)] > 100 * 1000


def _log_dir_sizes(response) -> dict:
    """(topic, partition) -> size from kafka-python's describe_log_dirs answer."""
    return {(topic["name"], partition["partition_index"]): partition["partition_size"]
            for broker in response for log_dir in broker["log_dirs"] for topic in log_dir["topics"]
            for partition in topic["partitions"]}


def test_describe_topic_partitions_pages_with_a_cursor_and_list_config_resources(ottla_broker):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    admin.create_topics([KPNewTopic("paged-a", 3, 1), KPNewTopic("paged-b", 2, 1)])
    first = admin.describe_topic_partitions(["paged-a", "paged-b", "missing"], response_partition_limit=4)
    pages = [first]
    while pages[-1]["next_cursor"] is not None:
        pages.append(admin.describe_topic_partitions(["paged-a", "paged-b", "missing"], response_partition_limit=4,
                                                     cursor=pages[-1]["next_cursor"]))
    assert first["next_cursor"] == {"topic_name": "paged-b", "partition_index": 1}
    seen = [(t["name"], p["partition_index"]) for page in pages for t in page["topics"] for p in t["partitions"]]
    assert seen == [("paged-a", 0), ("paged-a", 1), ("paged-a", 2), ("paged-b", 0), ("paged-b", 1)]
    errors = {t["name"]: t["error_code"] for page in pages for t in page["topics"]}
    assert errors["missing"] == 3  # UNKNOWN_TOPIC_OR_PARTITION

    resources = admin.list_config_resources(["TOPIC", "BROKER"])
    admin.close()
    assert {"paged-a", "paged-b"} <= set(resources["topic"])
    assert resources["broker"] == ["0"]


def test_scram_credentials_are_stored_described_and_survive_a_restart(ottla_broker):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)

    admin = _admin(ottla_broker.bootstrap)
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                          b"secret", b"salt")
    too_few = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 100),
                                           b"secret", b"salt")
    results = admin.alter_user_scram_credentials([upsert, too_few])
    results["alice"].result(15)
    with pytest.raises(KafkaException) as failed:
        results["bob"].result(15)
    assert failed.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL

    ottla_broker.restart()
    admin = _admin(ottla_broker.bootstrap)
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(15)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 8192)]
    with pytest.raises(KafkaException) as missing:
        admin.describe_user_scram_credentials(["bob"])["bob"].result(15)
    assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    deletion = UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)
    admin.alter_user_scram_credentials([deletion])["alice"].result(15)
    with pytest.raises(KafkaException):
        admin.describe_user_scram_credentials(["alice"])["alice"].result(15)


def test_broker_describe_configs_lists_static_configs_and_synonyms(ottla_broker_factory):
    from confluent_kafka.admin import ConfigSource

    broker = ottla_broker_factory({"log.retention.ms": 3600000})
    admin = _admin(broker.bootstrap)
    resource = ConfigResource("BROKER", "0")
    configs = admin.describe_configs([resource])[resource].result(15)
    host, _, port = broker.bootstrap.rpartition(":")
    assert configs["listeners"].value == f"PLAINTEXT://{host}:{port}"
    assert configs["advertised.listeners"].value == f"PLAINTEXT://{host}:{port}"
    assert configs["log.dirs"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["log.retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert not configs["log.retention.ms"].is_sensitive
    # A feature in Kafka 4 (ApiVersions' finalized features), not a config: Kafka does not list it.
    assert "transaction.version" not in configs
    admin.create_topics([NewTopic("synonyms", 1, 1, config={"retention.ms": "60000"})])["synonyms"].result(15)
    topic = ConfigResource("TOPIC", "synonyms")
    entry = admin.describe_configs([topic])[topic].result(15)["retention.ms"]
    synonyms = [(name, s.value, s.source) for name, s in entry.synonyms.items()]
    assert synonyms[:2] == [("retention.ms", "60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
                            ("log.retention.ms", "3600000", ConfigSource.STATIC_BROKER_CONFIG.value)]
    assert synonyms[-1][2] == ConfigSource.DEFAULT_CONFIG.value


def test_dirty_ratio_tag_is_sent_only_when_asked_and_clients_still_parse_it(ottla_broker):
    """Ottla's DescribeLogDirs tag 10000 (protocol/extensions.py). kio's reader refuses tags it
    does not know, so an answer to a plain request must not carry it; kafka-python (the one of
    confluent-kafka, kafka-python and aiokafka with a describe_log_dirs, flexible v4) reads
    both answers, keeping the tag it does not know aside."""
    import socket

    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic
    from kafka.protocol.admin.cluster import DescribeLogDirsResponse as KPDescribeLogDirsResponse
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    from ottla.protocol.build import make, nested
    from ottla.protocol.extensions import DIRTY_RATIO_TAG
    from ottla.protocol.schemas import request_schema
    from tests.wire import decode_response, encode_request, read_frame

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    admin.create_topics([KPNewTopic("changelog", 1, 1, topic_configs={
        "cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "1"})])
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for i in range(20):
        producer.send("changelog", key=b"k%d" % (i % 3), value=b"x" * 500, partition=0).get(30)
    producer.close()
    sizes = _log_dir_sizes(admin.describe_log_dirs())
    admin.close()
    assert sizes[("changelog", 0)] > 20 * 500

    def ask(request):
        with socket.create_connection((ottla_broker.host, ottla_broker.port), timeout=30) as sock:
            sock.sendall(encode_request(request))
            return read_frame(sock)

    plain_type = load_request_schema(35, 4)
    plain = ask(plain_type(topics=(nested(plain_type, "DescribableLogDirTopic")(topic="changelog", partitions=(0,)),)))
    kio_response = load_response_schema(35, 4)
    _, offset = entity_reader(kio_response.__header_schema__)(plain, 0)
    (result,) = entity_reader(kio_response)(plain, offset)[0].results
    assert result.topics[0].partitions[0].partition_size == sizes[("changelog", 0)]

    asking_type = request_schema(35, 4)
    wanted = make(nested(asking_type, "DescribableLogDirTopic"), topic="changelog", partitions=(0,))
    tagged = ask(make(asking_type, topics=(wanted,), dirty_ratio=True))
    with pytest.raises(KeyError, match=str(DIRTY_RATIO_TAG)):
        entity_reader(kio_response)(tagged, offset)
    (result,) = decode_response(tagged, 35, 4)[1].results
    assert result.topics[0].partitions[0].dirty_ratio == 1.0  # min.cleanable.dirty.ratio=1: never cleaned

    for frame, tags in ((plain, None), (tagged, {f"_{DIRTY_RATIO_TAG}"})):  # kafka-python's key
        (result,) = KPDescribeLogDirsResponse.decode(frame, version=4, header=True).results
        (partition,) = result.topics[0].partitions
        assert partition.partition_size == sizes[("changelog", 0)]
        assert (None if partition.unknown_tags is None else set(partition.unknown_tags)) == tags
