"""End offsets never go backwards across a failover (KIP-207), on three real `ottla serve`
processes and a real ZooKeeper.

Brokers A (leads), B (the controller) and C; one partition with replicas [A, B, C]. Every
broker runs with the failpoint `replica.hold_high_watermark`: a follower appends what its
leader sends but keeps its HW, as if each Fetch answer's HW were still in flight. Records are
acknowledged (A's HW moves on), C is SIGSTOPped (still in the ISR: its session and
replica.lag.time.max.ms outlast the test) and A shuts down cleanly, so the controller elects B,
whose HW is still 0, below the start offset of its new epoch. Until C fetches again (SIGCONT),
ListOffsets latest from B must not answer that HW, lower than what A answered: it answers
OFFSET_NOT_AVAILABLE, and the right offset once the HW has caught up; the Spark source plans
its next micro-batch from that, never from the older HW."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka import KafkaConsumer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets import v1, v7
from pyspark.sql.streaming.datasource import ReadAllAvailable

from ottla import end_offsets
from ottla.server.replica_fetcher import HOLD_HIGH_WATERMARK
from ottla.spark.options import parse_read_options
from ottla.spark.source import StreamReader, source_schema
from ottla.testing import cluster
from tests.cluster_checks import partition_info
from tests.waiting import wait_for
from tests.wire import roundtrip

TOPIC = "kip207"
COUNT = 5
LATEST, EARLIEST = -1, -2
FAR_FUTURE = 2**50  # a timestamp no record has: the answer would be "none that late"
PARTITION = CKTopicPartition(TOPIC, 0)
# C stays in the ISR while it is stopped: neither its ZooKeeper session nor the lag time runs out.
CONFIG = {"replica.lag.time.max.ms": 600_000, "auto.leader.rebalance.enable": False}
SESSION_MS = 600_000


def list_offsets(bootstrap: str, timestamp: int, version: int = 7) -> tuple[ErrorCode, int]:
    """(error, offset) of one ListOffsets request for the partition, read_uncommitted."""
    host, _, port = bootstrap.rpartition(":")
    module = {1: v1, 7: v7}[version]
    wanted = {"partition_index": 0, "timestamp": timestamp}
    if version >= 4:
        wanted["current_leader_epoch"] = -1
    fields = {"isolation_level": 0} if version >= 2 else {}
    request = module.request.ListOffsetsRequest(replica_id=-1, topics=(module.request.ListOffsetsTopic(
        name=TOPIC, partitions=(module.request.ListOffsetsPartition(**wanted),)),), **fields)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        answer = roundtrip(sock, request)[1].topics[0].partitions[0]
    return ErrorCode(answer.error_code), answer.offset


def stream_reader(bootstrap: str) -> StreamReader:
    """The Spark source's micro-batch planning (the driver side), without a Spark session."""
    return StreamReader(parse_read_options({"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC}),
                        source_schema(include_headers=False))


def test_a_new_leader_answers_offset_not_available_until_its_hw_reaches_its_epoch_start(tmp_path, monkeypatch):
    monkeypatch.setenv("OTTLA_FAILPOINTS", HOLD_HIGH_WATERMARK)
    with cluster(brokers=3, config=CONFIG, session_timeout_ms=SESSION_MS, root=tmp_path) as three:
        admin = AdminClient({"bootstrap.servers": three.bootstrap})
        b = admin.list_topics(timeout=30).controller_id
        a, c = sorted(i for i in three.brokers if i != b)
        broker_a, broker_b, broker_c = (three.brokers[i] for i in (a, b, c))
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[a, b, c]])])[TOPIC].result(60)
        wait_for(lambda: partition_info(three.bootstrap, TOPIC) == (a, (a, b, c), tuple(sorted((a, b, c)))),
                 what="A leading, ISR [A, B, C]")
        producer = Producer({"bootstrap.servers": three.bootstrap, "acks": "all", "linger.ms": 0})
        for i in range(COUNT):
            producer.produce(TOPIC, b"%d" % i, partition=0)
        assert producer.flush(60) == 0
        answered = [list_offsets(broker_a.bootstrap, LATEST)]
        assert answered == [(ErrorCode.none, COUNT)]
        planned = stream_reader(broker_a.bootstrap).latestOffset({TOPIC: {"0": 0}}, ReadAllAvailable())
        assert planned == {TOPIC: {"0": COUNT}}

        broker_c.pause()
        try:
            assert broker_a.stop() == 0
            wait_for(lambda: partition_info(broker_b.bootstrap, TOPIC) == (b, (a, b, c), tuple(sorted((b, c)))),
                     what="B leading after A's controlled shutdown")
            # B's HW is 0, its epoch starts at COUNT: answering latest 0 would go back from A's COUNT.
            assert list_offsets(broker_b.bootstrap, LATEST) == (ErrorCode.offset_not_available, -1)
            assert list_offsets(broker_b.bootstrap, FAR_FUTURE) == (ErrorCode.offset_not_available, -1)
            assert list_offsets(broker_b.bootstrap, LATEST, version=1) == (ErrorCode.leader_not_available, -1)
            assert list_offsets(broker_b.bootstrap, EARLIEST) == (ErrorCode.none, 0)

            # What the clients do with it: librdkafka's admin and consumer hand it over at once...
            admin_b = AdminClient({"bootstrap.servers": broker_b.bootstrap})
            with pytest.raises(KafkaException) as raised:
                admin_b.list_offsets({PARTITION: OffsetSpec.latest()}, request_timeout=10)[PARTITION].result()
            assert raised.value.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE
            consumer = Consumer({"bootstrap.servers": broker_b.bootstrap, "group.id": "kip207"})
            with pytest.raises(KafkaException) as raised:
                consumer.get_watermark_offsets(PARTITION, timeout=10)
            consumer.close()
            assert raised.value.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE
            # ... and ours asks again until its deadline, then hands it over.
            with pytest.raises(KafkaException) as raised:
                end_offsets.list_offsets(admin_b, {PARTITION: OffsetSpec.latest()}, timeout_s=1)
            assert raised.value.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE

            # Asked while C is still stopped, answered once it fetched again: ours and kafka-python's
            # consumer (which retries OFFSET_NOT_AVAILABLE itself until its timeout).
            # The Spark source plans its next micro-batch from there.
            with ThreadPoolExecutor(3) as pool:
                ours = pool.submit(lambda: end_offsets.list_offsets(
                    admin_b, {PARTITION: OffsetSpec.latest()}, timeout_s=120)[PARTITION].offset)
                spark = pool.submit(stream_reader(broker_b.bootstrap).latestOffset, planned, ReadAllAvailable())
                kp = KafkaConsumer(bootstrap_servers=broker_b.bootstrap, request_timeout_ms=120_000)
                kafka_python = pool.submit(lambda: kp.end_offsets([TopicPartition(TOPIC, 0)])[TopicPartition(TOPIC, 0)])
                broker_c.resume()
                answered += [ours.result(), kafka_python.result()]
                assert spark.result() == {TOPIC: {"0": COUNT}}
                kp.close()
        finally:
            broker_c.resume()
        answered.append(list_offsets(broker_b.bootstrap, LATEST))
        assert answered == [(ErrorCode.none, COUNT), COUNT, COUNT, (ErrorCode.none, COUNT)]
