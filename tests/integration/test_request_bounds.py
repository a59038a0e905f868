"""One request must not take gigabytes or hold the event loop (issue 11, F3; negative sizes from F4)."""

import re
from datetime import timedelta

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from tests.wire import roundtrip

TOPIC = "bounded"
BATCH_RECORDS, RECORD_BYTES = 20, 1000


def _batch() -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for i in range(BATCH_RECORDS):
        builder.append(i, timestamp=None, key=None, value=bytes([i]) * RECORD_BYTES, headers=[])
    return bytes(builder.build())


def _fill(sock, partitions: int, batches: int) -> int:
    """Produce `batches` batches to each partition; returns one batch's size."""
    batch = _batch()
    for _ in range(batches):
        request = ProduceRequest(transactional_id=None, acks=-1, timeout=timedelta(seconds=10), topic_data=(
            TopicProduceData(name=TOPIC, partition_data=tuple(
                PartitionProduceData(index=p, records=batch) for p in range(partitions))),))
        _, response = roundtrip(sock, request)
        assert all(p.error_code == ErrorCode.none for p in response.responses[0].partition_responses)
    return len(batch)


def _fetch(sock, partitions, *, max_bytes=2**31 - 1, partition_max_bytes=1 << 20):
    request = FetchRequest(max_wait=timedelta(0), min_bytes=0, max_bytes=max_bytes, topics=(
        FetchTopic(topic=TOPIC, partitions=tuple(
            FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=partition_max_bytes) for p in partitions)),),
        forgotten_topics_data=())
    _, response = roundtrip(sock, request)
    return response


@pytest.fixture
def topic_broker(ottla_broker_factory):
    def start(config=None, partitions=1):
        broker = ottla_broker_factory(config)
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)
        return broker
    return start


def test_a_partition_named_many_times_is_read_once(topic_broker, raw_connection):
    broker = topic_broker()
    sock = raw_connection(broker.bootstrap)
    batch_bytes = _fill(sock, 1, 10)
    response = _fetch(sock, [0] * 100)
    partitions = [p for t in response.responses for p in t.partitions]
    assert [p.partition_index for p in partitions] == [0]
    assert len(partitions[0].records) == 10 * batch_bytes


def test_the_broker_fetch_max_bytes_caps_the_response(topic_broker, raw_connection):
    broker = topic_broker({"fetch.max.bytes": 100_000}, partitions=3)
    sock = raw_connection(broker.bootstrap)
    batch_bytes = _fill(sock, 3, 10)  # 3 x ~200 KB
    response = _fetch(sock, [0, 1, 2])
    total = sum(len(p.records or b"") for t in response.responses for p in t.partitions)
    assert 0 < total <= 100_000
    # The first batch is returned even when it alone is over the limit (KIP-74).
    broker = topic_broker({"fetch.max.bytes": 1000}, partitions=3)
    sock = raw_connection(broker.bootstrap)
    _fill(sock, 3, 2)
    response = _fetch(sock, [0, 1, 2])
    assert [len(p.records or b"") for t in response.responses for p in t.partitions] == [batch_bytes, 0, 0]


def test_a_negative_partition_max_bytes_gets_kafkas_error(topic_broker, raw_connection):
    broker = topic_broker()
    sock = raw_connection(broker.bootstrap)
    _fill(sock, 1, 1)
    response = _fetch(sock, [0], partition_max_bytes=-5)
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.unknown_server_error]
    assert _fetch(sock, [0]).responses[0].partitions[0].error_code == ErrorCode.none


def test_describe_configs_naming_the_broker_50000_times_answers_once(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory(log_level="info")
    sock = raw_connection(broker.bootstrap, timeout=120)
    request = DescribeConfigsRequest(resources=tuple(
        DescribeConfigsResource(resource_type=4, resource_name="0", configuration_keys=None) for _ in range(50_000)))
    _, response = roundtrip(sock, request)
    assert len(response.results) == 1 and response.results[0].error_code == ErrorCode.none
    assert len(response.results[0].configs) > 10
    broker.stop()
    worst = re.findall(r"event loop: worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms",
                       broker.read_stderr())
    assert len(worst) == 1  # the probe ran and reported (the number itself is in docs/performance.md)
