"""Bad input gets Kafka's answer, only the offending connection is closed, nothing on disk changes."""

import os
import struct
from datetime import timedelta

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v8.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from tests.wire import decode_response, encode_request, is_closed, read_frame, roundtrip

TOPIC = "guarded"


def _batch(values, *, size_hint=1 << 22) -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=size_hint)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    return bytearray(builder.build())


def _produce(sock, records, *, acks=-1, topic=TOPIC, correlation_id=3):
    request = ProduceRequest(transactional_id=None, acks=acks, timeout=timedelta(seconds=5), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=bytes(records)),)),))
    _, response = roundtrip(sock, request, correlation_id)
    return response.responses[0].partition_responses[0]


def _log_end_offset(sock) -> int:
    request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        ListOffsetsTopic(name=TOPIC, partitions=(ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                      timestamp=-1),)),))
    _, response = roundtrip(sock, request)
    return response.topics[0].partitions[0].offset


def _healthy(raw_connection, bootstrap) -> bool:
    sock = raw_connection(bootstrap)
    _, response = roundtrip(sock, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    return response.error_code == ErrorCode.none


def _disk_state(data_dir):
    return {path: os.path.getsize(os.path.join(root, path))
            for root, _, files in os.walk(data_dir) for path in files if path.endswith(".log")}


@pytest.fixture
def guarded(ottla_broker, raw_connection):
    """A broker with one topic holding one record, and a bystander connection kept open throughout."""
    bystander = raw_connection(ottla_broker.bootstrap)
    roundtrip(bystander, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False))
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    assert _produce(bystander, _batch([b"first"])).error_code == ErrorCode.none
    before = _disk_state(ottla_broker.data_dir)
    yield ottla_broker, bystander
    # The bystander connection still works and the log holds exactly the one good record.
    assert _log_end_offset(bystander) == 1
    assert _disk_state(ottla_broker.data_dir) == before
    assert _healthy(raw_connection, ottla_broker.bootstrap)


@pytest.mark.parametrize("frame", [
    struct.pack(">i", 12) + os.urandom(12),
    struct.pack(">i", 3) + b"\x00\x03\x00",
    struct.pack(">i", -1),
    struct.pack(">i", 2**31 - 1),
    struct.pack(">ihhi", 8, 999, 0, 1),  # unknown API key
    struct.pack(">ihhi", 8, 3, 99, 1),  # Metadata v99
], ids=["garbage", "short-header", "negative-size", "huge-size", "unknown-api", "unsupported-version"])
def test_protocol_violations_close_only_that_connection(guarded, raw_connection, frame):
    broker, _ = guarded
    sock = raw_connection(broker.bootstrap)
    sock.sendall(frame)
    assert is_closed(sock)


def test_frame_over_socket_request_max_bytes_is_closed(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"socket.request.max.bytes": 1000})
    sock = raw_connection(broker.bootstrap)
    sock.sendall(struct.pack(">i", 1001) + b"\0" * 1001)
    assert is_closed(sock)
    assert _healthy(raw_connection, broker.bootstrap)


def test_unsupported_api_versions_version_gets_v0_answer(guarded, raw_connection):
    broker, _ = guarded
    sock = raw_connection(broker.bootstrap)
    sock.sendall(struct.pack(">ihhih", 10, 18, 99, 77, -1))
    correlation_id, response = decode_response(read_frame(sock), 18, 0)
    assert correlation_id == 77
    assert response.error_code == ErrorCode.unsupported_version
    assert any(k.api_key == 18 and k.max_version >= 3 for k in response.api_keys)


def test_corrupt_crc_is_corrupt_message(guarded):
    _, sock = guarded
    batch = _batch([b"x" * 100])
    batch[-1] ^= 0xFF
    assert _produce(sock, batch).error_code == ErrorCode.corrupt_message


def test_truncated_batch_is_corrupt_message(guarded):
    _, sock = guarded
    assert _produce(sock, _batch([b"x" * 100])[:-10]).error_code == ErrorCode.corrupt_message


def test_oversized_batch_is_message_too_large(guarded):
    _, sock = guarded
    big = _batch([os.urandom(600_000), os.urandom(600_000)])
    assert _produce(sock, big).error_code == ErrorCode.message_too_large


def test_invalid_acks(guarded):
    _, sock = guarded
    assert _produce(sock, _batch([b"a"]), acks=5).error_code == ErrorCode.invalid_required_acks


def test_unknown_and_internal_topics(guarded):
    _, sock = guarded
    assert _produce(sock, _batch([b"a"]), topic="no-such-topic").error_code == ErrorCode.unknown_topic_or_partition
    assert _produce(sock, _batch([b"a"]), topic="__consumer_offsets").error_code in (
        ErrorCode.invalid_topic_exception, ErrorCode.unknown_topic_or_partition)


def test_pipelined_requests_answer_in_order(guarded, raw_connection):
    broker, _ = guarded
    sock = raw_connection(broker.bootstrap)
    requests = [ApiVersionsRequest(client_software_name="t", client_software_version="1") for _ in range(20)]
    sock.sendall(b"".join(encode_request(r, correlation_id=100 + i) for i, r in enumerate(requests)))
    ids = [decode_response(read_frame(sock), 18, 3)[0] for _ in requests]
    assert ids == list(range(100, 120))


def test_failed_acks_0_produce_closes_the_connection(ottla_broker, raw_connection):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic("fire-and-forget", 1, 1)])["fire-and-forget"].result(10)
    sock = raw_connection(ottla_broker.bootstrap)

    def produce(records, correlation_id):
        request = ProduceRequest(transactional_id=None, acks=0, timeout=timedelta(seconds=5), topic_data=(
            TopicProduceData(name="fire-and-forget", partition_data=(
                PartitionProduceData(index=0, records=bytes(records)),)),))
        sock.sendall(encode_request(request, correlation_id))

    produce(_batch([b"ok"]), 5)
    assert not is_closed(sock, timeout=0.5)  # no response, the connection stays
    bad = _batch([b"x"])
    bad[-1] ^= 0xFF
    produce(bad, 6)
    assert is_closed(sock)  # the only way to tell an acks=0 client its write failed
    assert _healthy(raw_connection, ottla_broker.bootstrap)
