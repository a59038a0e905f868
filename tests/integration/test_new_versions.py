"""Request versions Kafka 3.9 and 4.x serve that Ottla once did not (issue 15).

ListOffsets v9-v11 carry the tiered-storage offset specs: without remote storage Kafka
answers earliest local (-4) with the earliest offset and latest tiered (-5) / earliest pending
upload (-6) with offset -1, and a spec the request's version predates with
UNSUPPORTED_VERSION for that partition. kafka-python's admin client asks with the version each
spec needs; the rest is sent as raw frames built from the schema classes.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.consumer.offsets import OffsetSpec
from kio.schema.errors import ErrorCode

from ottla.protocol.schemas import request_schema
from tests.wire import roundtrip

TOPIC = "new-versions"
RECORDS = 10
DELETED_BEFORE = 4


@pytest.fixture
def filled(ottla_broker):
    """A topic of ten records whose first four were deleted (log start 4)."""
    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap, request_timeout_ms=20000)
    admin.create_topics([NewTopic(TOPIC, 1, 1)])
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap)
    for i in range(RECORDS):
        producer.send(TOPIC, value=b"%d" % i, partition=0, timestamp_ms=1_700_000_000_000 + i)
    producer.flush(30)
    producer.close()
    admin.delete_records({TopicPartition(TOPIC, 0): DELETED_BEFORE})
    yield ottla_broker, admin
    admin.close()


def test_kafka_python_lists_tiered_offset_specs(filled):
    _, admin = filled
    tp = TopicPartition(TOPIC, 0)
    local = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST_LOCAL})[tp]
    assert (local.offset, local.timestamp) == (DELETED_BEFORE, -1)
    tiered = admin.list_partition_offsets({tp: OffsetSpec.LATEST_TIERED})[tp]
    assert (tiered.offset, tiered.timestamp, tiered.leader_epoch) == (-1, -1, None)


def _list_offsets(sock, version: int, timestamp: int):
    schema = request_schema(2, version)
    topic_type = schema.__dataclass_fields__["topics"].type.__args__[0]
    partition_type = topic_type.__dataclass_fields__["partitions"].type.__args__[0]
    fields = {"replica_id": -1, "isolation_level": 0,
              "topics": (topic_type(name=TOPIC, partitions=(partition_type(
                  partition_index=0, current_leader_epoch=-1, timestamp=timestamp),)),)}
    if version >= 10:
        fields["timeout"] = timedelta(seconds=5)
    _, response = roundtrip(sock, schema(**fields))
    found = response.topics[0].partitions[0]
    return found.error_code, found.offset, found.timestamp, found.leader_epoch


@pytest.mark.parametrize("version", [9, 10, 11])
def test_list_offsets_specs_at_each_new_version(filled, version):
    broker, _ = filled
    host, _, port = broker.bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert _list_offsets(sock, version, -2)[:3] == (ErrorCode.none, DELETED_BEFORE, -1)
        assert _list_offsets(sock, version, -4)[:3] == (ErrorCode.none, DELETED_BEFORE, -1)
        assert _list_offsets(sock, version, -5) == (ErrorCode.none, -1, -1, -1)
        pending = _list_offsets(sock, version, -6)
        if version >= 11:
            assert pending == (ErrorCode.none, -1, -1, -1)
        else:  # v9/v10 predate KIP-1023
            assert pending[0] == ErrorCode.unsupported_version
        assert _list_offsets(sock, version, -7)[0] == ErrorCode.unsupported_version  # no such spec
        assert _list_offsets(sock, version, -1)[:2] == (ErrorCode.none, RECORDS)


def test_list_offsets_refuses_a_spec_newer_than_the_version(filled):
    broker, _ = filled
    host, _, port = broker.bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert _list_offsets(sock, 7, -4)[0] == ErrorCode.unsupported_version
        assert _list_offsets(sock, 8, -5)[0] == ErrorCode.unsupported_version
        assert _list_offsets(sock, 8, -4)[:3] == (ErrorCode.none, DELETED_BEFORE, -1)


def _connect(broker):
    host, _, port = broker.bootstrap.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_metadata_v13_has_a_top_level_error_code(filled):
    from kio.schema.metadata.v13.request import MetadataRequest, MetadataRequestTopic
    broker, _ = filled
    with _connect(broker) as sock:
        _, response = roundtrip(sock, MetadataRequest(topics=(MetadataRequestTopic(name=TOPIC, topic_id=None),),
                                                      allow_auto_topic_creation=False,
                                                      include_topic_authorized_operations=False))
    assert response.error_code == ErrorCode.none
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [(TOPIC, ErrorCode.none, 1)]


def test_describe_log_dirs_v5_reports_no_cordoned_directory(filled):
    from kio.schema.describe_log_dirs.v5.request import DescribableLogDirTopic, DescribeLogDirsRequest
    broker, _ = filled
    with _connect(broker) as sock:
        _, response = roundtrip(sock, DescribeLogDirsRequest(
            topics=(DescribableLogDirTopic(topic=TOPIC, partitions=(0,)),)))
    (result,) = response.results
    assert (response.error_code, result.error_code, result.is_cordoned) == (ErrorCode.none, ErrorCode.none, False)
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == [(TOPIC, [0])]
    assert result.topics[0].partitions[0].partition_size > 0


def _producer_state(sock, topic):
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
    _, response = roundtrip(sock, DescribeProducersRequest(topics=(TopicRequest(name=topic, partition_indexes=(0,)),)))
    (state,) = response.topics[0].partitions[0].active_producers
    return state.producer_id, state.producer_epoch, state.current_txn_start_offset


def _marker(sock, producer_id, epoch, transaction_version, topic):
    from kio.schema.write_txn_markers.v2.request import (WritableTxnMarker, WritableTxnMarkerTopic,
                                                         WriteTxnMarkersRequest)
    _, response = roundtrip(sock, WriteTxnMarkersRequest(markers=(WritableTxnMarker(
        producer_id=producer_id, producer_epoch=epoch, transaction_result=True, coordinator_epoch=0,
        topics=(WritableTxnMarkerTopic(name=topic, partition_indexes=(0,)),),
        transaction_version=transaction_version),)))
    return response.markers[0].topics[0].partitions[0].error_code


def test_write_txn_markers_v2_checks_a_tv2_markers_epoch(ottla_broker):
    """A transaction-version-2 marker must carry an epoch above the open transaction's; the
    same epoch passes with transaction version 0 (as v1 markers do) and, once the transaction
    has ended, as the retry of a TV2 marker already written."""
    from confluent_kafka import Producer
    topic = "tv2-markers"
    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()  # else its thread refreshes the stopped broker's metadata for the rest of the session
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap, "transactional.id": "tv2",
                         "transaction.timeout.ms": 600000})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    assert producer.flush(30) == 0
    with _connect(ottla_broker) as sock:
        producer_id, epoch, txn_start = _producer_state(sock, topic)
        assert txn_start == 0
        assert _marker(sock, producer_id, epoch, 2, topic) == ErrorCode.invalid_producer_epoch
        assert _producer_state(sock, topic)[2] == 0  # still open: nothing was written
        assert _marker(sock, producer_id, epoch + 1, 2, topic) == ErrorCode.none
        assert _producer_state(sock, topic) == (producer_id, epoch + 1, -1)
        assert _marker(sock, producer_id, epoch + 1, 2, topic) == ErrorCode.none  # a retry
        assert _marker(sock, producer_id, epoch + 1, 0, topic) == ErrorCode.none
        assert _marker(sock, producer_id, epoch, 2, topic) == ErrorCode.invalid_producer_epoch
