"""KIP-951 on a real two-broker cluster: after a partition's leadership moves from broker 1
to broker 2 (reassignment to [2, 1], then a preferred election), a Produce v11 sent to the
old leader is refused NOT_LEADER_OR_FOLLOWER naming broker 2 and its new leader epoch, with
broker 2's endpoint; a Fetch v16 to the old leader is refused the same way, and one to the
new leader with the old epoch gets FENCED_LEADER_EPOCH with the same hint. Clients that read
these (librdkafka 2.4+, the Java client) go to the new leader without a Metadata round trip:
a librdkafka producer whose partition's leadership moves under it applies the hint (its
METADATAUPDATE debug line) and loses nothing. A broker that hosts no replica of a partition
the cluster has answers Produce, Fetch and ListOffsets for it NOT_LEADER_OR_FOLLOWER (Kafka's
getPartitionOrError), with the same hint, not UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import threading
from datetime import timedelta

import pytest
from confluent_kafka import ElectionType, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v16 import request as fetch16
from kio.schema.list_offsets.v8 import request as list_offsets8
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v11 import request as produce11

from ottla.admin_client import AdminProtocolClient
from ottla.testing import cluster
from tests.waiting import wait_for
from tests.wire import roundtrip

TOPIC = "moved"


@pytest.fixture(scope="module")
def shared_two(tmp_path_factory):
    with cluster(brokers=2, root=tmp_path_factory.mktemp("leader-hints")) as handle:
        yield handle


@pytest.fixture
def two(shared_two):
    return shared_two.restore()  # a test that failed midway leaves nothing down for the next


def _connect(bootstrap: str) -> socket.socket:
    host, _, port = bootstrap.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=60)


def _leader(sock, topic: str = TOPIC) -> tuple[int, int, tuple[int, ...], object]:
    """(leader id, leader epoch, replicas, topic id) of the topic's partition 0 as this broker's
    Metadata says."""
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=topic),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    topic = roundtrip(sock, request)[1].topics[0]
    if topic.error_code != ErrorCode.none or not topic.partitions:
        return -1, -1, (), None
    partition = topic.partitions[0]
    return partition.leader_id, partition.leader_epoch, tuple(partition.replica_nodes), topic.topic_id


def _produce(sock, topic: str = TOPIC):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 16)
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    request = produce11.ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=10), topic_data=(
        produce11.TopicProduceData(name=topic, partition_data=(
            produce11.PartitionProduceData(index=0, records=bytes(builder.build())),)),))
    return roundtrip(sock, request)[1]


def _fetch(sock, topic_id, current_leader_epoch: int):
    request = fetch16.FetchRequest(max_wait=timedelta(0), min_bytes=0, forgotten_topics_data=(), topics=(
        fetch16.FetchTopic(topic_id=topic_id, partitions=(fetch16.FetchPartition(
            partition=0, current_leader_epoch=current_leader_epoch, fetch_offset=0, partition_max_bytes=1 << 20),)),))
    return roundtrip(sock, request)[1]


def _move_leader_to_2(two, admin, sock, topic: str) -> None:
    """Partition 0 of `topic`, led by broker 1 on replicas [1, 2], moved to broker 2 as an
    operator does: reassignment to [2, 1], then a preferred election."""
    with AdminProtocolClient(two.bootstrap, timeout=30) as client:
        client.alter_partition_reassignment(topic, 0, [2, 1], timeout_ms=30_000)
    wait_for(lambda: _leader(sock, topic)[2] == (2, 1), what="replicas reordered to [2, 1]")
    wait_for(lambda: admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(topic, 0)]).result(30) is not None,
             what="a preferred election")


def _hint(partition) -> tuple[int, int]:
    return partition.current_leader.leader_id, partition.current_leader.leader_epoch


def test_refusals_name_the_moved_leader(two):
    old, new = two.brokers[1], two.brokers[2]
    admin = AdminClient({"bootstrap.servers": two.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2]])])[TOPIC].result(60)
    old_sock, new_sock = _connect(old.bootstrap), _connect(new.bootstrap)
    _, first_epoch, _, topic_id = wait_for(lambda: (lambda m: m[0] == 1 and m)(_leader(old_sock)),
                                           what="broker 1 leading")
    assert _produce(old_sock).responses[0].partition_responses[0].error_code == ErrorCode.none

    _move_leader_to_2(two, admin, old_sock, TOPIC)
    _, new_epoch, _, _ = wait_for(lambda: (lambda m: m[0] == 2 and m)(_leader(old_sock)),
                                  what="broker 1 knowing broker 2 leads")
    assert new_epoch > first_epoch
    host, _, port = new.bootstrap.rpartition(":")
    endpoint = [(2, host, int(port))]

    produced = _produce(old_sock)
    refused = produced.responses[0].partition_responses[0]
    assert refused.error_code == ErrorCode.not_leader_or_follower
    assert _hint(refused) == (2, new_epoch)
    assert [(n.node_id, n.host, n.port) for n in produced.node_endpoints] == endpoint

    fetched = _fetch(old_sock, topic_id, -1)
    refused = fetched.responses[0].partitions[0]
    assert (refused.error_code, _hint(refused)) == (ErrorCode.not_leader_or_follower, (2, new_epoch))
    assert [(n.node_id, n.host, n.port) for n in fetched.node_endpoints] == endpoint

    wait_for(lambda: _leader(new_sock)[:2] == (2, new_epoch), what="broker 2 knowing it leads")
    fenced = _fetch(new_sock, topic_id, first_epoch)
    refused = fenced.responses[0].partitions[0]
    assert (refused.error_code, _hint(refused)) == (ErrorCode.fenced_leader_epoch, (2, new_epoch))
    assert [(n.node_id, n.host, n.port) for n in fenced.node_endpoints] == endpoint
    assert _fetch(new_sock, topic_id, new_epoch).responses[0].partitions[0].error_code == ErrorCode.none
    old_sock.close()
    new_sock.close()


def test_librdkafka_producer_follows_the_hint(two):
    topic = "moved-live"
    admin = AdminClient({"bootstrap.servers": two.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2]])])[topic].result(60)
    sock = _connect(two.brokers[1].bootstrap)
    wait_for(lambda: _leader(sock, topic)[0] == 1, what="broker 1 leading")
    stream = io.StringIO()
    logger = logging.getLogger("test_leader_hints_cluster.librdkafka")
    logger.addHandler(logging.StreamHandler(stream))
    logger.setLevel(logging.DEBUG)
    producer = Producer({"bootstrap.servers": two.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "debug": "metadata"}, logger=logger)
    sent, delivered, stop = [0], [], threading.Event()

    def produce():
        while not stop.is_set():
            producer.produce(topic, b"%d" % sent[0], on_delivery=lambda err, msg: delivered.append(err))
            sent[0] += 1
            producer.poll(0.005)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        wait_for(lambda: len(delivered) > 10, what="the producer under way")
        _move_leader_to_2(two, admin, sock, topic)
        wait_for(lambda: _leader(sock, topic)[0] == 2, what="broker 2 leading")
        count = len(delivered)
        wait_for(lambda: len(delivered) > count + 10, what="deliveries from the new leader")
    finally:
        stop.set()
        thread.join()
    assert producer.flush(60) == 0
    sock.close()
    assert len(delivered) == sent[0] and not any(delivered)
    # Logged by rd_kafka_metadata_update_op, which only a KIP-951 hint in a response calls.
    assert re.search(rf"Partition {topic}\([^)]*\)\[0\]: updated with leader 2 ", stream.getvalue())


def test_a_broker_without_a_replica_answers_not_leader(two):
    """Partition 0 of `elsewhere` lives on broker 1 only; broker 2 knows it from its metadata."""
    topic = "elsewhere"
    admin = AdminClient({"bootstrap.servers": two.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1]])])[topic].result(60)
    sock = _connect(two.brokers[2].bootstrap)
    _, epoch, _, topic_id = wait_for(lambda: (lambda m: m[0] == 1 and m)(_leader(sock, topic)),
                                     what="broker 2 knowing broker 1 leads")
    host, _, port = two.brokers[1].bootstrap.rpartition(":")
    endpoint = [(1, host, int(port))]

    produced = _produce(sock, topic)
    refused = produced.responses[0].partition_responses[0]
    assert (refused.error_code, _hint(refused)) == (ErrorCode.not_leader_or_follower, (1, epoch))
    assert [(n.node_id, n.host, n.port) for n in produced.node_endpoints] == endpoint

    fetched = _fetch(sock, topic_id, -1)
    refused = fetched.responses[0].partitions[0]
    assert (refused.error_code, _hint(refused)) == (ErrorCode.not_leader_or_follower, (1, epoch))
    assert [(n.node_id, n.host, n.port) for n in fetched.node_endpoints] == endpoint

    request = list_offsets8.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        list_offsets8.ListOffsetsTopic(name=topic, partitions=(
            list_offsets8.ListOffsetsPartition(partition_index=0, timestamp=-1),)),))
    listed = roundtrip(sock, request)[1].topics[0].partitions[0]
    assert listed.error_code == ErrorCode.not_leader_or_follower
    # A partition the cluster does not have stays UNKNOWN_TOPIC_OR_PARTITION.
    missing = _produce(sock, "no-such-topic").responses[0].partition_responses[0]
    assert missing.error_code == ErrorCode.unknown_topic_or_partition
    sock.close()
