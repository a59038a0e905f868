"""The controller APIs on a single node (no ZooKeeper): it is its own controller and only replica."""

from __future__ import annotations

import io
import struct
import uuid

import kafka.errors as Errors
from confluent_kafka import ElectionType, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KPTopicPartition
from kio.serial import entity_reader, entity_writer

from ottla.controller import wire
from ottla.controller.requests import ControllerRequest, LeaderAndIsrPayload, PartitionState
from ottla.errors import ErrorCode
from ottla.protocol.schemas import response_schema
from tests.wire import read_frame


def _create(bootstrap, name, partitions=2):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return admin


def test_elect_leaders_is_never_needed_on_one_node(ottla_broker):
    admin = _create(ottla_broker.bootstrap, "t")
    future = admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition("t", 0), CKTopicPartition("nope", 0)])
    results = future.result(30)
    assert results[CKTopicPartition("t", 0)].code() == ErrorCode.election_not_needed.value
    assert results[CKTopicPartition("nope", 0)].code() == ErrorCode.unknown_topic_or_partition.value


def test_reassignments_on_one_node_with_kafka_python(ottla_broker):
    _create(ottla_broker.bootstrap, "t")
    client = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    try:
        result = client.alter_partition_reassignments({KPTopicPartition("t", 0): [0]})
        assert result == {KPTopicPartition("t", 0): None}
        bad = client.alter_partition_reassignments({KPTopicPartition("t", 1): [5], KPTopicPartition("x", 0): [0]})
        assert bad[KPTopicPartition("t", 1)].errno == ErrorCode.invalid_replica_assignment.value
        assert bad[KPTopicPartition("x", 0)] is Errors.UnknownTopicOrPartitionError
        assert client.list_partition_reassignments() == {}
    finally:
        client.close()


def test_leader_and_isr_is_refused_without_a_controller(ottla_broker, raw_connection):
    _create(ottla_broker.bootstrap, "t", 1)
    state = PartitionState("t", 0, 5, 7, 9, (7,), 0, (7,))
    request = ControllerRequest(0, "LeaderAndIsr", LeaderAndIsrPayload(7, 5, -1, (state,), {"t": uuid.uuid4()}, ()))
    api_key, version, message = wire.to_message(request)
    sock = raw_connection(ottla_broker.bootstrap)
    header_type = type(message).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(request_api_key=api_key, request_api_version=version,
                                                correlation_id=3, client_id="controller-7"))
    entity_writer(type(message))(out, message)
    sock.sendall(struct.pack(">i", len(out.getvalue())) + out.getvalue())
    frame = read_frame(sock)
    schema = response_schema(api_key, version)
    header, size = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, size)
    assert header.correlation_id == 3 and body.error_code == ErrorCode.stale_controller_epoch
    # Nothing changed: the partition is still led here.
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap})
    producer.produce("t", b"v")
    assert producer.flush(30) == 0
