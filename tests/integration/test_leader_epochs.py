"""Leader epochs on the wire against a real broker: OffsetsForLeaderEpoch, and KIP-320's
current_leader_epoch in Fetch and ListOffsets; real consumers, which send their metadata's
leader epoch, read as before."""

from functools import partial
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v8.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.offset_for_leader_epoch import v2, v3, v4

from tests.wire import roundtrip
from tests.waiting import wait_for as _wait_for

TOPIC = "epochs"
COUNT = 7


@pytest.fixture
def epoch_topic(ottla_broker, raw_connection):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap, "linger.ms": 0})
    for i in range(COUNT):
        producer.produce(TOPIC, value=b"%d" % i, partition=0)
        producer.flush(10)
    return ottla_broker, raw_connection(ottla_broker.bootstrap)


def offsets_for_epoch(sock, version, leader_epoch, current_leader_epoch=-1, topic=TOPIC, replica_id=-1):
    module = {2: v2, 3: v3, 4: v4}[version]
    fields = {"replica_id": replica_id} if version >= 3 else {}
    request = module.OffsetForLeaderEpochRequest(topics=(module.request.OffsetForLeaderTopic(
        topic=topic, partitions=(module.request.OffsetForLeaderPartition(
            partition=0, current_leader_epoch=current_leader_epoch, leader_epoch=leader_epoch),)),), **fields)
    answer = roundtrip(sock, request)[1].topics[0].partitions[0]
    return answer.error_code, answer.leader_epoch, answer.end_offset


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offsets_for_leader_epoch(epoch_topic, version):
    _, sock = epoch_topic
    assert offsets_for_epoch(sock, version, 0) == (ErrorCode.none, 0, COUNT)  # the current epoch ends at the LEO
    assert offsets_for_epoch(sock, version, 0, current_leader_epoch=0) == (ErrorCode.none, 0, COUNT)
    assert offsets_for_epoch(sock, version, 3) == (ErrorCode.none, -1, -1)  # an epoch the leader never had
    assert offsets_for_epoch(sock, version, 0, current_leader_epoch=1) == (ErrorCode.unknown_leader_epoch, -1, -1)
    assert offsets_for_epoch(sock, version, 0, topic="nope")[0] == ErrorCode.unknown_topic_or_partition


def test_offsets_for_leader_epoch_answers_a_follower_the_same(epoch_topic):
    _, sock = epoch_topic
    assert offsets_for_epoch(sock, 4, 0, current_leader_epoch=0, replica_id=2) == (ErrorCode.none, 0, COUNT)


def fetch(sock, current_leader_epoch, *, fetch_offset=0, last_fetched_epoch=-1):
    request = FetchRequest(cluster_id=None, replica_id=-1, max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1,
                           topics=(FetchTopic(topic=TOPIC, partitions=(FetchPartition(
                               partition=0, current_leader_epoch=current_leader_epoch, fetch_offset=fetch_offset,
                               last_fetched_epoch=last_fetched_epoch, log_start_offset=-1,
                               partition_max_bytes=1 << 20),)),),
                           forgotten_topics_data=(), rack_id="")
    return roundtrip(sock, request)[1].responses[0].partitions[0]


def test_fetch_checks_the_current_leader_epoch(epoch_topic):
    _, sock = epoch_topic
    for epoch in (-1, 0):
        answer = fetch(sock, epoch)
        assert answer.error_code == ErrorCode.none and answer.high_watermark == COUNT and answer.records
    newer = fetch(sock, 1)
    assert newer.error_code == ErrorCode.unknown_leader_epoch and not newer.records and newer.high_watermark == -1
    older = fetch(sock, -5)  # any epoch below the partition's, which is 0 on a single node
    assert older.error_code == ErrorCode.fenced_leader_epoch and not older.records


def test_fetch_answers_a_diverging_epoch(epoch_topic):
    """Fetch v12's last_fetched_epoch (KIP-595): a fetcher ahead of the leader in epoch 0 is
    told where epoch 0 ends here instead of getting records or OFFSET_OUT_OF_RANGE."""
    _, sock = epoch_topic
    ahead = fetch(sock, 0, fetch_offset=COUNT + 3, last_fetched_epoch=0)
    assert ahead.error_code == ErrorCode.none and not ahead.records
    assert (ahead.diverging_epoch.epoch, ahead.diverging_epoch.end_offset) == (0, COUNT)
    agreeing = fetch(sock, 0, fetch_offset=2, last_fetched_epoch=0)
    assert agreeing.error_code == ErrorCode.none and agreeing.records
    assert agreeing.diverging_epoch.epoch == -1
    unknown = fetch(sock, 0, fetch_offset=2, last_fetched_epoch=3)
    assert unknown.error_code == ErrorCode.offset_out_of_range


def list_offsets(sock, timestamp, current_leader_epoch):
    request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(ListOffsetsTopic(
        name=TOPIC, partitions=(ListOffsetsPartition(
            partition_index=0, current_leader_epoch=current_leader_epoch, timestamp=timestamp),)),))
    answer = roundtrip(sock, request)[1].topics[0].partitions[0]
    return answer.error_code, answer.offset, answer.leader_epoch


def test_list_offsets_checks_the_current_leader_epoch_and_names_epochs(epoch_topic):
    _, sock = epoch_topic
    assert list_offsets(sock, -1, 0) == (ErrorCode.none, COUNT, 0)
    assert list_offsets(sock, -2, -1) == (ErrorCode.none, 0, 0)
    assert list_offsets(sock, -1, 1)[0] == ErrorCode.unknown_leader_epoch
    assert list_offsets(sock, -2, -5)[0] == ErrorCode.fenced_leader_epoch


def test_api_versions_lists_offsets_for_leader_epoch(epoch_topic):
    _, sock = epoch_topic
    response = roundtrip(sock, ApiVersionsRequest(client_software_name="t", client_software_version="1"))[1]
    assert [(k.min_version, k.max_version) for k in response.api_keys if k.api_key == 23] == [(0, 4)]


def test_real_consumers_read_with_their_leader_epochs(epoch_topic):
    broker, _ = epoch_topic
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen = []
        while len(seen) < COUNT:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            seen.append(message.value())
            assert message.leader_epoch() == 0
        assert seen == [b"%d" % i for i in range(COUNT)]
    finally:
        consumer.close()
    python_consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=10_000)
    try:
        python_consumer.assign([KafkaTopicPartition(TOPIC, 0)])
        python_consumer.seek(KafkaTopicPartition(TOPIC, 0), 0)
        assert [m.value for m in python_consumer][:COUNT] == [b"%d" % i for i in range(COUNT)]
    finally:
        python_consumer.close()


wait_for = partial(_wait_for, timeout=30.0, interval=0.05)


def test_checkpoints_survive_kill_9_and_a_lost_epoch_file_is_rebuilt(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"replica.high.watermark.checkpoint.interval.ms": 200})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(COUNT):
        producer.produce(TOPIC, value=b"%d" % i, partition=0)
    producer.flush(10)
    hw_file = broker.data_dir / "replication-offset-checkpoint"
    wait_for(lambda: hw_file.exists() and f"{TOPIC} 0 {COUNT}\n" in hw_file.read_text())
    epoch_file = broker.data_dir / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    assert epoch_file.read_text() == "0\n1\n0 0\n"

    broker.kill()
    epoch_file.unlink()
    hw_file.write_text(f"0\n1\n{TOPIC} 0 2\n")  # a stale HW: a lone leader's HW is its log end anyway
    broker.start()
    assert epoch_file.read_text() == "0\n1\n0 0\n"
    sock = raw_connection(broker.bootstrap)
    assert offsets_for_epoch(sock, 4, 0, current_leader_epoch=0) == (ErrorCode.none, 0, COUNT)
    assert fetch(sock, 0).high_watermark == COUNT
