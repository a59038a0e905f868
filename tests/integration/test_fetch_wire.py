"""Fetch semantics on the wire: long polling, size limits, whole batches, compression (sessions:
`test_fetch_sessions.py`)."""

import threading
import time
from datetime import timedelta

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from tests.wire import roundtrip

TOPIC = "wire"
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _fetch(sock, partitions, *, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20, partition_max_bytes=1 << 20,
           session_id=0, session_epoch=-1, isolation=0):
    request = FetchRequest(cluster_id=None, replica_id=-1, max_wait=timedelta(milliseconds=max_wait_ms),
                           min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=isolation,
                           session_id=session_id, session_epoch=session_epoch,
                           topics=(FetchTopic(topic=TOPIC, partitions=tuple(
                               FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=offset,
                                              last_fetched_epoch=-1, log_start_offset=-1,
                                              partition_max_bytes=partition_max_bytes)
                               for p, offset in partitions)),),
                           forgotten_topics_data=(), rack_id="")
    return roundtrip(sock, request)[1]


def _batches(records: bytes):
    """Split a record set into (base offset, raw bytes) per batch."""
    out, position = [], 0
    while position < len(records):
        size = int.from_bytes(records[position + 8:position + 12], "big") + 12
        out.append((int.from_bytes(records[position:position + 8], "big"), records[position:position + size]))
        position += size
    return out


@pytest.fixture
def wire_topic(ottla_broker, raw_connection):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(10)
    return ottla_broker, raw_connection(ottla_broker.bootstrap)


def _produce_batches(bootstrap, partition, count, size):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i in range(count):
        producer.produce(TOPIC, value=bytes([i % 256]) * size, partition=partition)
        producer.flush(10)  # one record per batch


def test_long_poll_returns_when_data_arrives(wire_topic):
    broker, sock = wire_topic
    timer = threading.Timer(0.5, _produce_batches, args=(broker.bootstrap, 0, 1, 10))
    timer.start()
    response = _fetch(sock, [(0, 0)], max_wait_ms=30_000)
    timer.join()
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    assert partition.high_watermark == 1
    assert [offset for offset, _ in _batches(partition.records)] == [0]


def test_long_poll_times_out_empty(wire_topic):
    _, sock = wire_topic
    response = _fetch(sock, [(0, 0)], max_wait_ms=300)
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none and not partition.records


def test_min_bytes_waits_for_enough_data(wire_topic):
    broker, sock = wire_topic
    _produce_batches(broker.bootstrap, 0, 1, 100)
    timer = threading.Timer(0.5, _produce_batches, args=(broker.bootstrap, 0, 3, 1000))
    timer.start()
    response = _fetch(sock, [(0, 0)], max_wait_ms=30_000, min_bytes=2000)
    timer.join()
    records = response.responses[0].partitions[0].records
    assert len(records) >= 2000  # it did not answer with the first small batch alone


def test_partition_and_total_max_bytes_return_whole_batches(wire_topic):
    broker, sock = wire_topic
    _produce_batches(broker.bootstrap, 0, 10, 1000)
    _produce_batches(broker.bootstrap, 1, 10, 1000)
    response = _fetch(sock, [(0, 0), (1, 0)], partition_max_bytes=2500)
    for partition in response.responses[0].partitions:
        batches = _batches(partition.records)
        assert [offset for offset, _ in batches] == [0, 1]  # two whole batches fit in 2500 bytes
        assert sum(len(raw) for _, raw in batches) == len(partition.records)
    response = _fetch(sock, [(0, 0), (1, 0)], max_bytes=2500)
    first, second = response.responses[0].partitions
    assert [offset for offset, _ in _batches(first.records)] == [0, 1]
    assert len(first.records) + len(second.records) <= 2500


def test_at_least_one_batch_even_when_larger_than_max_bytes(wire_topic):
    broker, sock = wire_topic
    _produce_batches(broker.bootstrap, 0, 2, 5000)
    response = _fetch(sock, [(0, 0)], max_bytes=100, partition_max_bytes=100)
    assert [offset for offset, _ in _batches(response.responses[0].partitions[0].records)] == [0]


def test_out_of_range_and_unknown_partition(wire_topic):
    _, sock = wire_topic
    response = _fetch(sock, [(0, 5), (7, 0)])
    errors = {p.partition_index: p.error_code for p in response.responses[0].partitions}
    assert errors == {0: ErrorCode.offset_out_of_range, 7: ErrorCode.unknown_topic_or_partition}


def test_a_partition_with_an_error_carries_empty_records_not_null(wire_topic):
    """Kafka answers MemoryRecords.EMPTY with every error; librdkafka refuses a null record
    set ("invalid MessageSetSize -1", a protocol parse failure of the whole response), which
    after a leader change stalled a consumer's other partitions too."""
    _, sock = wire_topic
    response = _fetch(sock, [(0, 5), (7, 0)])
    assert [p.records for p in response.responses[0].partitions] == [b"", b""]


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_compressed_batches_roundtrip_byte_exact(wire_topic, codec):
    _, sock = wire_topic
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS[codec], is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(500):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"value %d " % i * 20,
                       headers=[("h", b"%d" % i)])
    sent = bytes(builder.build())
    request = ProduceRequest(transactional_id=None, acks=-1, timeout=timedelta(seconds=5), topic_data=(
        TopicProduceData(name=TOPIC, partition_data=(PartitionProduceData(index=1, records=sent),)),))
    produced = roundtrip(sock, request)[1].responses[0].partition_responses[0]
    assert produced.error_code == ErrorCode.none
    fetched = _fetch(sock, [(1, produced.base_offset)]).responses[0].partitions[0].records
    (offset, raw), = _batches(fetched)
    assert offset == produced.base_offset
    # Only the base offset and the partition leader epoch (not covered by the CRC) may differ.
    assert raw[17:] == sent[17:] and raw[8:12] == sent[8:12]
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc() and batch.compression_type == CODECS[codec]
    assert [r.value for r in batch] == [b"value %d " % i * 20 for i in range(500)]


def test_log_append_time_and_max_timestamp_lookup(ottla_broker, raw_connection):
    from kio.schema.list_offsets.v8.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic("stamped", 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
                         NewTopic("created", 1, 1)])["created"].result(10)
    sock = raw_connection(ottla_broker.bootstrap)
    before = int(time.time() * 1000)
    for topic, stamps in (("stamped", [5, 7, 6]), ("created", [5, 9, 6])):
        for stamp in stamps:
            builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                                producer_epoch=-1, base_sequence=-1, batch_size=1 << 16)
            builder.append(0, timestamp=stamp, key=None, value=b"v", headers=[])
            request = ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=5), topic_data=(
                TopicProduceData(name=topic, partition_data=(
                    PartitionProduceData(index=0, records=bytes(builder.build())),)),))
            answer = roundtrip(sock, request)[1].responses[0].partition_responses[0]
            assert answer.error_code == ErrorCode.none
            assert (answer.log_append_time is not None) == (topic == "stamped")

    def max_timestamp(topic):
        request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(ListOffsetsTopic(name=topic, partitions=(
            ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-3),)),))
        partition = roundtrip(sock, request)[1].topics[0].partitions[0]
        return partition.offset, partition.timestamp

    assert max_timestamp("created") == (1, 9)
    offset, stamp = max_timestamp("stamped")
    assert stamp >= before  # the broker's clock replaced the producer's timestamps

    request = FetchRequest(cluster_id=None, replica_id=-1, max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=(FetchTopic(topic="stamped", partitions=(
                               FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                              log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                           forgotten_topics_data=(), rack_id="")
    records = roundtrip(sock, request)[1].responses[0].partitions[0].records
    for _, raw in _batches(records):
        batch = DefaultRecordBatch(raw)
        assert batch.validate_crc() and batch.timestamp_type == 1
        assert [r.timestamp for r in batch] == [batch.max_timestamp] and batch.max_timestamp >= before
