"""Fetch v13-v16 on a single broker: topics named by topic id (KIP-516), the follower's id in
`replica_state` (v15, KIP-903), and leader hints with node endpoints (v16, KIP-951); and
librdkafka, which fetches with the newest version both sides serve, consuming with v16."""

from __future__ import annotations

import io
import logging
import re
import time
import uuid
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.fetch.v15 import request as fetch15
from kio.schema.fetch.v16 import request as fetch16
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from tests.wire import roundtrip

TOPIC = "by-id"


def _topic_id(sock, topic: str) -> uuid.UUID:
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=topic),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return roundtrip(sock, request)[1].topics[0].topic_id


def _fetch(module, sock, topic_id, partitions, **request_fields):
    request = module.FetchRequest(
        max_wait=timedelta(0), min_bytes=0, topics=(module.FetchTopic(topic_id=topic_id, partitions=tuple(
            module.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20) for p in partitions)),),
        forgotten_topics_data=(), **request_fields)
    return roundtrip(sock, request)[1]


@pytest.fixture
def produced(ottla_broker, raw_connection):
    """TOPIC with two partitions, three records in partition 0; a raw connection."""
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap})
    for i in range(3):
        producer.produce(TOPIC, value=b"record-%d" % i, partition=0)
    assert producer.flush(10) == 0
    return ottla_broker, raw_connection(ottla_broker.bootstrap)


@pytest.mark.parametrize("module", [fetch13, fetch16], ids=["v13", "v16"])
def test_fetch_names_topics_by_id(produced, module):
    _, sock = produced
    topic_id = _topic_id(sock, TOPIC)
    response = _fetch(module, sock, topic_id, [0, 1])
    assert [t.topic_id for t in response.responses] == [topic_id]
    first, second = response.responses[0].partitions
    assert (first.error_code, first.high_watermark) == (ErrorCode.none, 3)
    assert b"record-2" in bytes(first.records)
    assert (second.error_code, second.high_watermark) == (ErrorCode.none, 0)


def test_unknown_topic_id_is_answered_unknown_topic_id(produced):
    _, sock = produced
    known, unknown = _topic_id(sock, TOPIC), uuid.uuid4()
    request = fetch16.FetchRequest(
        max_wait=timedelta(0), min_bytes=0, forgotten_topics_data=(), topics=tuple(
            fetch16.FetchTopic(topic_id=topic_id, partitions=(
                fetch16.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),))
            for topic_id in (unknown, known)))
    response = roundtrip(sock, request)[1]
    assert [t.topic_id for t in response.responses] == [unknown, known]
    assert response.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
    assert response.responses[1].partitions[0].error_code == ErrorCode.none
    assert response.node_endpoints == ()


def test_v15_follower_id_is_read_from_replica_state(produced):
    """A follower fetch (replica_state.replica_id >= 0) from a broker that is no replica is
    refused NOT_LEADER_OR_FOLLOWER, as Kafka refuses it; a consumer's is served. From v16 the
    refusal names the partition's leader (this broker) and its endpoint."""
    broker, sock = produced
    topic_id = _topic_id(sock, TOPIC)
    consumer = _fetch(fetch15, sock, topic_id, [0])
    assert consumer.responses[0].partitions[0].error_code == ErrorCode.none
    follower = _fetch(fetch15, sock, topic_id, [0], replica_state=fetch15.ReplicaState(replica_id=7, replica_epoch=-1))
    assert follower.responses[0].partitions[0].error_code == ErrorCode.not_leader_or_follower
    hinted = _fetch(fetch16, sock, topic_id, [0], replica_state=fetch16.ReplicaState(replica_id=7, replica_epoch=-1))
    partition = hinted.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.not_leader_or_follower
    assert (partition.current_leader.leader_id, partition.current_leader.leader_epoch) == (0, 0)
    host, _, port = broker.bootstrap.rpartition(":")
    assert [(n.node_id, n.host, n.port) for n in hinted.node_endpoints] == [(0, host, int(port))]


def test_librdkafka_consumes_with_fetch_v16(produced):
    broker, _ = produced
    stream = io.StringIO()
    logger = logging.getLogger("test_fetch_topic_ids.librdkafka")
    logger.addHandler(logging.StreamHandler(stream))
    logger.setLevel(logging.DEBUG)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "by-id", "auto.offset.reset": "earliest",
                         "debug": "protocol"}, logger=logger)
    try:
        consumer.subscribe([TOPIC])
        values, deadline = [], time.monotonic() + 60
        while len(values) < 3 and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"record-0", b"record-1", b"record-2"]
    versions = set(re.findall(r"Sent FetchRequest \(v(\d+)", stream.getvalue()))
    assert versions == {"16"}


def test_a_consumer_holding_a_deleted_topics_id_moves_to_the_recreated_topic(produced):
    """Deleted and recreated under the same name, the topic has a new id. librdkafka's fetches
    of the old topic are refused (UNKNOWN_TOPIC_OR_PARTITION for one waiting when the topic
    went, as Kafka's delayed fetch answers; UNKNOWN_TOPIC_ID for the old id after it); it
    refreshes its metadata and consumes the new topic from its start."""
    broker, _ = produced
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "recreated",
                         "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 600_000})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        consumer.subscribe([TOPIC])
        assert _poll_values(consumer, 3) == [b"record-0", b"record-1", b"record-2"]
        admin.delete_topics([TOPIC])[TOPIC].result(10)
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce(TOPIC, value=b"recreated-0")
        assert producer.flush(10) == 0
        assert _poll_values(consumer, 1) == [b"recreated-0"]
    finally:
        consumer.close()


def _poll_values(consumer, count: int) -> list[bytes]:
    values, deadline = [], time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def test_produce_v13_and_fetch_v18_name_topics_by_id(produced):
    """Produce v13 (Kafka 4.1) names topics by id as Fetch does: an id the broker knows is
    appended to, one it does not is UNKNOWN_TOPIC_ID, and the response names topics by id.
    Fetch v17-v18 (KRaft's tagged follower fields) read as v16."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.fetch.v18 import request as fetch18
    from kio.schema.produce.v13 import request as produce13

    _, sock = produced
    topic_id, unknown = _topic_id(sock, TOPIC), uuid.uuid4()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 16)
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"by-id-13", headers=[])
    records = bytes(builder.build())
    request = produce13.ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=10), topic_data=tuple(
        produce13.TopicProduceData(topic_id=id_, partition_data=(produce13.PartitionProduceData(index=0, records=records),))
        for id_ in (topic_id, unknown)))
    produced13 = roundtrip(sock, request)[1]
    assert [t.topic_id for t in produced13.responses] == [topic_id, unknown]
    known, missing = (t.partition_responses[0] for t in produced13.responses)
    assert (known.error_code, known.base_offset) == (ErrorCode.none, 3)
    assert missing.error_code == ErrorCode.unknown_topic_id

    fetched = _fetch(fetch18, sock, topic_id, [0])
    assert [t.topic_id for t in fetched.responses] == [topic_id]
    assert fetched.responses[0].partitions[0].high_watermark == 4
    assert b"by-id-13" in bytes(fetched.responses[0].partitions[0].records)
