"""Clients of the pre-KIP-896 generation: request versions Kafka 3.9 accepted and 4.0 dropped.

kafka-python pinned to an old broker version sends Produce v2 / Fetch v2 with message
format v1 (and v0 formats for 0.9), OffsetCommit v1-v2 and DescribeConfigs v0; raw frames
built from the generated schema classes cover what no client here sends any more.
"""

import socket

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kio.schema.errors import ErrorCode

from ottla.protocol.schemas import request_schema
from tests.wire import decode_response, encode_request, read_frame

KIP_896_REMOVED = {0: 0, 1: 0, 2: 0, 8: 0, 9: 0, 19: 0, 20: 0, 23: 0, 32: 0, 27: 0}


def _admin(bootstrap, api_version=None):
    return KafkaAdminClient(bootstrap_servers=bootstrap, api_version=api_version, request_timeout_ms=20000)


def _create_topic(bootstrap, topic):
    """Closed after: a client left open refreshes the stopped broker's metadata for the rest of
    the session, and its threads' calls to `random` show up in later tests' Hypothesis draws."""
    admin = _admin(bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


@pytest.mark.parametrize("api_version,magic", [((0, 10, 1), 1), ((0, 9), 0)])
def test_kafka_python_old_message_formats_round_trip(ottla_broker, api_version, magic):
    topic = f"old-format-{magic}"
    _create_topic(ottla_broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap, api_version=api_version,
                             compression_type="gzip" if magic else None, linger_ms=5)
    futures = [producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0) for i in range(50)]
    offsets = [future.get(timeout=30).offset for future in futures]
    producer.close()
    assert offsets == list(range(50))

    consumer = KafkaConsumer(bootstrap_servers=ottla_broker.bootstrap, api_version=api_version,
                             enable_auto_commit=False, consumer_timeout_ms=10000, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, 0)])
    got = [(m.offset, m.key, m.value) for m in consumer]
    consumer.close()
    assert got == [(i, f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]


def test_old_offset_commit_and_describe_configs(ottla_broker):
    """OffsetCommit v1/v2 from a group consumer of the 0.10 era, DescribeConfigs v0."""
    topic = "old-commits"
    _create_topic(ottla_broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for i in range(5):
        producer.send(topic, value=b"x", partition=0)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=ottla_broker.bootstrap, api_version=(0, 10, 1),
                             group_id="old-group", enable_auto_commit=False, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000)
    assert len(list(consumer)) == 5
    consumer.commit()
    consumer.close()
    fresh = KafkaConsumer(bootstrap_servers=ottla_broker.bootstrap, group_id="old-group", enable_auto_commit=False)
    assert fresh.committed(TopicPartition(topic, 0)) == 5
    fresh.close()

    admin = _admin(ottla_broker.bootstrap, api_version=(0, 11))  # a 0.11 broker knows DescribeConfigs v0 only
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    admin.close()
    entry = configs["topic"][topic]["cleanup.policy"]
    assert (entry["value"], entry["config_source"]) == ("delete", "DEFAULT_CONFIG")


def _call(bootstrap, request, api_key, version):
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(encode_request(request))
        return decode_response(read_frame(sock), api_key, version)[1]


def test_raw_v0_requests_from_the_generated_classes(ottla_broker):
    """OffsetCommit v0, OffsetFetch v0 and ListOffsets v0 answered in their own layout."""
    topic = "raw-old"
    _create_topic(ottla_broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for _ in range(3):
        producer.send(topic, value=b"x", partition=0)
    producer.close()

    commit = request_schema(8, 0)
    commit_topic = commit.__dataclass_fields__["topics"].type.__args__[0]
    commit_partition = commit_topic.__dataclass_fields__["partitions"].type.__args__[0]
    response = _call(ottla_broker.bootstrap, commit(group_id="raw", topics=(commit_topic(name=topic, partitions=(
        commit_partition(partition_index=0, committed_offset=2, committed_metadata="m"),)),)), 8, 0)
    assert response.topics[0].partitions[0].error_code == ErrorCode.none

    fetch = request_schema(9, 0)
    fetch_topic = fetch.__dataclass_fields__["topics"].type.__args__[0]
    response = _call(ottla_broker.bootstrap, fetch(group_id="raw", topics=(fetch_topic(name=topic, partition_indexes=(0,)),)), 9, 0)
    partition = response.topics[0].partitions[0]
    assert (partition.committed_offset, partition.metadata, partition.error_code) == (2, "m", ErrorCode.none)

    offsets = request_schema(2, 0)
    offsets_topic = offsets.__dataclass_fields__["topics"].type.__args__[0]
    offsets_partition = offsets_topic.__dataclass_fields__["partitions"].type.__args__[0]
    response = _call(ottla_broker.bootstrap, offsets(replica_id=-1, topics=(offsets_topic(name=topic, partitions=(
        offsets_partition(partition_index=0, timestamp=-1, max_num_offsets=5),)),)), 2, 0)
    assert response.topics[0].partitions[0].old_style_offsets == (3, 0)


@pytest.mark.parametrize("version", [0, 1])
def test_raw_offset_for_leader_epoch_v0_v1(ottla_broker, version):
    """OffsetForLeaderEpoch v0-1 (a follower of Kafka 2.0 or older): no replica id, no current
    leader epoch to fence with; v1 answers the leader epoch, v0 only the end offset."""
    topic = f"raw-epoch-v{version}"
    _create_topic(ottla_broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for _ in range(3):
        producer.send(topic, value=b"x", partition=0)
    producer.close()

    request = request_schema(23, version)
    request_topic = request.__dataclass_fields__["topics"].type.__args__[0]
    request_partition = request_topic.__dataclass_fields__["partitions"].type.__args__[0]
    response = _call(ottla_broker.bootstrap, request(topics=(request_topic(topic=topic, partitions=(
        request_partition(partition=0, leader_epoch=0), request_partition(partition=7, leader_epoch=0))),)), 23, version)
    found, missing = response.topics[0].partitions
    assert (found.partition, found.error_code, found.end_offset) == (0, ErrorCode.none, 3)
    assert getattr(found, "leader_epoch", None) == (0 if version == 1 else None)
    assert (missing.partition, missing.error_code) == (7, ErrorCode.unknown_topic_or_partition)


def test_api_versions_advertises_the_removed_versions(ottla_broker):
    response = _call(ottla_broker.bootstrap, request_schema(18, 0)(), 18, 0)
    versions = {key.api_key: (key.min_version, key.max_version) for key in response.api_keys}
    for api_key, low in KIP_896_REMOVED.items():
        assert versions[api_key][0] == low, api_key
