"""The controller's requests through Kafka 3.9's message classes and back, byte for byte."""

from __future__ import annotations

import io
import uuid

from kio.serial import entity_reader, entity_writer

from ottla.cluster.store import BrokerRegistration
from ottla.controller import wire
from ottla.controller.requests import (ControllerRequest, LeaderAndIsrPayload, PartitionState, StopReplicaPartition,
                                       StopReplicaPayload, UpdateMetadataPayload)
from ottla.protocol.build import make, nested
from ottla.protocol.schemas import request_schema, response_schema

TID = uuid.uuid4()
BROKERS = (BrokerRegistration(1, "127.0.0.1", 9001, "r1", 11), BrokerRegistration(2, "127.0.0.1", 9002, None, 12))
STATE = PartitionState("t", 3, 2, 1, 7, (1, 2), 5, (1, 2, 4), adding_replicas=(4,), removing_replicas=(),
                       offline_replicas=(4,), is_new=True)


def round_trip(api_key, version, message):
    cls = request_schema(api_key, version)
    out = io.BytesIO()
    entity_writer(cls)(out, message)
    decoded, _ = entity_reader(cls)(memoryview(out.getvalue()), 0)
    return decoded


def test_leader_and_isr_round_trip():
    request = ControllerRequest(2, "LeaderAndIsr", LeaderAndIsrPayload(1, 2, 12, (STATE,), {"t": TID}, BROKERS[:1]))
    decoded = round_trip(*wire.to_message(request))
    assert decoded.controller_epoch == 2 and decoded.broker_epoch == 12 and decoded.controller_id == 1
    [state] = wire.partition_states(decoded)
    assert state == PartitionState("t", 3, 2, 1, 7, (1, 2), 5, (1, 2, 4), (4,), (), (), True)
    assert wire.topic_ids(decoded) == {"t": TID}
    assert [(b.broker_id, b.host_name, b.port) for b in decoded.live_leaders] == [(1, "127.0.0.1", 9001)]


def test_update_metadata_round_trip():
    request = ControllerRequest(1, "UpdateMetadata", UpdateMetadataPayload(1, 2, 11, (STATE,), BROKERS, {"t": TID}))
    decoded = round_trip(*wire.to_message(request))
    [state] = wire.partition_states(decoded, "zk_version")
    assert state.offline_replicas == (4,) and state.partition_epoch == 5 and state.leader_epoch == 7
    assert wire.live_brokers(decoded) == [BrokerRegistration(1, "127.0.0.1", 9001, "r1"),
                                          BrokerRegistration(2, "127.0.0.1", 9002, None)]


def test_stop_replica_round_trip_and_answer():
    request = ControllerRequest(2, "StopReplica", StopReplicaPayload(1, 2, 12, (
        StopReplicaPartition("t", 0, -2, True), StopReplicaPartition("t", 1, 4, False))))
    api_key, version, message = wire.to_message(request)
    decoded = round_trip(api_key, version, message)
    assert [(p.partition_index, p.leader_epoch, p.delete_partition)
            for t in decoded.topic_states for p in t.partition_states] == [(0, -2, True), (1, 4, False)]
    response_cls = response_schema(api_key, version)
    error_cls = nested(response_cls, "StopReplicaPartitionError")
    response = make(response_cls, error_code=0, partition_errors=(
        make(error_cls, topic_name="t", partition_index=0, error_code=0),
        make(error_cls, topic_name="t", partition_index=1, error_code=56)))
    assert wire.stop_replica_errors(request, response) == {("t", 0): 0, ("t", 1): 56}
    assert wire.stop_replica_errors(request, make(response_cls, error_code=11, partition_errors=())) == {
        ("t", 0): 11, ("t", 1): 11}


def test_controlled_shutdown_request():
    decoded = round_trip(*wire.controlled_shutdown_request(3, 99))
    assert decoded.broker_id == 3 and decoded.broker_epoch == 99
