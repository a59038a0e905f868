"""DeleteRecords (API 21) from confluent-kafka's, kafka-python's and aiokafka's admin clients and
`ottla topics delete-records`: the log start offset moves, ListOffsets earliest and consumers
follow, and the segments wholly below it are gone from disk."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

TOPIC_CONFIG = {"segment.bytes": "2000"}  # a few dozen small records per segment


def _create(bootstrap: str, name: str, config: dict | None = None, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config or TOPIC_CONFIG)])[name].result(30)


def _produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%05d" % i, partition=partition)
        producer.poll(0)
        if i % 10 == 9:
            producer.flush(30)  # one batch per few records, so there are many segments
    assert producer.flush(30) == 0


def _earliest(bootstrap: str, topic: str, partition: int = 0) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition)
    return admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset


def _first_consumed(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
    try:
        while True:
            message = consumer.poll(30)
            assert message is not None, "nothing consumed"
            if message.error() is None:
                return message.offset()
    finally:
        consumer.close()


def _segment_bases(data_dir, topic: str) -> list[int]:
    return sorted(int(n[:-4]) for n in os.listdir(data_dir / f"{topic}-0") if n.endswith(".log"))


def _check_moved(broker, topic: str, offset: int) -> None:
    assert _earliest(broker.bootstrap, topic) == offset
    assert _first_consumed(broker.bootstrap, topic) == offset
    bases = _segment_bases(broker.data_dir, topic)
    assert bases[0] <= offset, bases
    assert len(bases) == 1 or bases[1] > offset, f"a segment wholly below {offset} survived: {bases}"


def test_confluent_kafka_delete_records(ottla_broker):
    _create(ottla_broker.bootstrap, "dr-ck")
    _produce(ottla_broker.bootstrap, "dr-ck", 300)
    before = _segment_bases(ottla_broker.data_dir, "dr-ck")
    assert len(before) > 3
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    tp = TopicPartition("dr-ck", 0, 150)
    deleted = admin.delete_records([tp])[tp].result(30)
    assert deleted.low_watermark == 150
    _check_moved(ottla_broker, "dr-ck", 150)
    assert len(_segment_bases(ottla_broker.data_dir, "dr-ck")) < len(before)

    # Past the high watermark: OFFSET_OUT_OF_RANGE, and nothing moves.
    tp = TopicPartition("dr-ck", 0, 301)
    with pytest.raises(KafkaException) as raised:
        admin.delete_records([tp])[tp].result(30)
    assert raised.value.args[0].name() == "OFFSET_OUT_OF_RANGE"
    # OFFSET_END (-1): everything up to the high watermark.
    tp = TopicPartition("dr-ck", 0, -1)
    assert admin.delete_records([tp])[tp].result(30).low_watermark == 300
    assert _earliest(ottla_broker.bootstrap, "dr-ck") == 300

    # The log start offset survives a restart (clean, and kill -9 after the checkpoint).
    ottla_broker.restart()
    assert _earliest(ottla_broker.bootstrap, "dr-ck") == 300


def test_compacted_and_internal_topics_refuse(ottla_broker):
    _create(ottla_broker.bootstrap, "dr-compact", {"cleanup.policy": "compact"})
    _produce(ottla_broker.bootstrap, "dr-compact", 10)
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    # TOPIC_EXCEPTION is librdkafka's name for INVALID_TOPIC_EXCEPTION (17).
    for topic, error in (("dr-compact", "POLICY_VIOLATION"), ("__consumer_offsets", "TOPIC_EXCEPTION")):
        tp = TopicPartition(topic, 0, 1)
        with pytest.raises(KafkaException) as raised:
            admin.delete_records([tp])[tp].result(30)
        assert raised.value.args[0].name() == error
    assert _earliest(ottla_broker.bootstrap, "dr-compact") == 0


def test_kafka_python_delete_records(ottla_broker):
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition

    _create(ottla_broker.bootstrap, "dr-kp")
    _produce(ottla_broker.bootstrap, "dr-kp", 200)
    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    try:
        result = admin.delete_records({KTopicPartition("dr-kp", 0): 120})
    finally:
        admin.close()
    assert [v["low_watermark"] if isinstance(v, dict) else v for v in result.values()] == [120]
    _check_moved(ottla_broker, "dr-kp", 120)


def test_aiokafka_delete_records(ottla_broker):
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.structs import TopicPartition as ATopicPartition

    _create(ottla_broker.bootstrap, "dr-aio")
    _produce(ottla_broker.bootstrap, "dr-aio", 200)

    async def delete():
        admin = AIOKafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
        await admin.start()
        try:
            return await admin.delete_records({ATopicPartition("dr-aio", 0): RecordsToDelete(before_offset=77)})
        finally:
            await admin.close()

    result = asyncio.run(delete())
    assert list(result.values()) == [77]
    _check_moved(ottla_broker, "dr-aio", 77)


def test_cli_delete_records(ottla_broker):
    _create(ottla_broker.bootstrap, "dr-cli", partitions=2)
    _produce(ottla_broker.bootstrap, "dr-cli", 100)
    env = {**os.environ, "OTTLA_BOOTSTRAP": ottla_broker.bootstrap}
    run = subprocess.run([sys.executable, "-m", "ottla.cli", "topics", "delete-records", "dr-cli",
                          "-p", "0", "--before", "60"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["PARTITION", "LOG-START", "0", "60"]
    _check_moved(ottla_broker, "dr-cli", 60)
    run = subprocess.run([sys.executable, "-m", "ottla.cli", "topics", "delete-records", "dr-cli",
                          "-p", "0", "--before", "1000"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "out of range" in run.stderr.lower(), run.stderr


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_delete_records_version_moves_the_log_start(ottla_broker, raw_connection, version):
    """Kafka serves DeleteRecords v0-v2 (v2 flexible); the clients above each pick one."""
    from datetime import timedelta

    from kio.schema.errors import ErrorCode

    from ottla.protocol.build import make, nested
    from ottla.protocol.schemas import request_schema
    from tests.wire import roundtrip

    topic, before = f"dr-v{version}", 40 + version
    _create(ottla_broker.bootstrap, topic)
    _produce(ottla_broker.bootstrap, topic, 100)
    schema = request_schema(21, version)
    request = make(schema, timeout=timedelta(seconds=30), topics=(make(
        nested(schema, "DeleteRecordsTopic"), name=topic, partitions=(make(
            nested(schema, "DeleteRecordsPartition"), partition_index=0, offset=before),)),))
    _, response = roundtrip(raw_connection(ottla_broker.bootstrap), request)
    (result,) = response.topics[0].partitions
    assert (result.partition_index, result.low_watermark, result.error_code) == (0, before, ErrorCode.none)
    _check_moved(ottla_broker, topic, before)
