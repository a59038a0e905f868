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
