"""The controller's plain-data requests as Kafka's messages, and back.

The controller sends Kafka 3.9's newest versions (LeaderAndIsr v7, UpdateMetadata v8,
StopReplica v4); brokers answer with the generated response classes. The broker side reads
the same messages back into plain data (`partition_states`, `live_brokers`), so the
handlers and the metadata cache never see the wire's nesting.
"""

from __future__ import annotations

from typing import Any

from kio.static.primitive import i8, i16, i32, i64

from ..cluster.store import BrokerRegistration, TopicPartition
from ..protocol.build import make, nested
from ..protocol.schemas import request_schema
from .requests import ControllerRequest, PartitionState

__all__ = ["API_KEYS", "VERSIONS", "to_message", "stop_replica_errors", "partition_states", "live_brokers",
           "controlled_shutdown_request"]

API_KEYS = {"LeaderAndIsr": 4, "StopReplica": 5, "UpdateMetadata": 6}
VERSIONS = {"LeaderAndIsr": 7, "StopReplica": 4, "UpdateMetadata": 8, "ControlledShutdown": 3}
PLAINTEXT = 0  # SecurityProtocol.PLAINTEXT
LISTENER = "PLAINTEXT"


def _by_topic(partitions) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for p in partitions:
        grouped.setdefault(p.topic, []).append(p)
    return grouped


def to_message(request: ControllerRequest) -> tuple[int, int, Any]:
    """(api key, api version, request entity) for one controller request."""
    kind = request.kind
    version = VERSIONS[kind]
    cls = request_schema(API_KEYS[kind], version)
    payload = request.payload
    common = dict(controller_id=i32(payload.controller_id), controller_epoch=i32(payload.controller_epoch),
                  broker_epoch=i64(payload.broker_epoch), is_k_raft_controller=False)
    if kind == "LeaderAndIsr":
        state_cls, topic_cls = nested(cls, "LeaderAndIsrPartitionState"), nested(cls, "LeaderAndIsrTopicState")
        leader_cls = nested(cls, "LeaderAndIsrLiveLeader")
        topics = tuple(make(topic_cls, topic_name=topic, topic_id=payload.topic_ids.get(topic), partition_states=tuple(
            make(state_cls, partition_index=i32(s.partition), controller_epoch=i32(s.controller_epoch),
                 leader=i32(s.leader), leader_epoch=i32(s.leader_epoch), isr=tuple(i32(r) for r in s.isr),
                 partition_epoch=i32(s.partition_epoch), replicas=tuple(i32(r) for r in s.replicas),
                 adding_replicas=tuple(i32(r) for r in s.adding_replicas),
                 removing_replicas=tuple(i32(r) for r in s.removing_replicas), is_new=s.is_new,
                 leader_recovery_state=i8(0))
            for s in states)) for topic, states in _by_topic(payload.partitions).items())
        leaders = tuple(make(leader_cls, broker_id=i32(b.broker_id), host_name=b.host, port=i32(b.port))
                        for b in payload.live_leaders)
        return API_KEYS[kind], version, make(cls, **common, type_=i8(0), topic_states=topics, live_leaders=leaders)
    if kind == "UpdateMetadata":
        state_cls, topic_cls = nested(cls, "UpdateMetadataPartitionState"), nested(cls, "UpdateMetadataTopicState")
        broker_cls, endpoint_cls = nested(cls, "UpdateMetadataBroker"), nested(cls, "UpdateMetadataEndpoint")
        topics = tuple(make(topic_cls, topic_name=topic, topic_id=payload.topic_ids.get(topic), partition_states=tuple(
            make(state_cls, partition_index=i32(s.partition), controller_epoch=i32(s.controller_epoch),
                 leader=i32(s.leader), leader_epoch=i32(s.leader_epoch), isr=tuple(i32(r) for r in s.isr),
                 zk_version=i32(s.partition_epoch), replicas=tuple(i32(r) for r in s.replicas),
                 offline_replicas=tuple(i32(r) for r in s.offline_replicas))
            for s in states)) for topic, states in _by_topic(payload.partitions).items())
        brokers = tuple(make(broker_cls, id_=i32(b.broker_id), rack=b.rack, endpoints=(
            make(endpoint_cls, port=i32(b.port), host=b.host, listener=LISTENER,
                 security_protocol=i16(PLAINTEXT)),)) for b in payload.live_brokers)
        return API_KEYS[kind], version, make(cls, **common, type_=i8(0), topic_states=topics, live_brokers=brokers)
    state_cls, topic_cls = nested(cls, "StopReplicaPartitionState"), nested(cls, "StopReplicaTopicState")
    topics = tuple(make(topic_cls, topic_name=topic, partition_states=tuple(
        make(state_cls, partition_index=i32(p.partition), leader_epoch=i32(p.leader_epoch),
             delete_partition=p.delete) for p in parts)) for topic, parts in _by_topic(payload.partitions).items())
    return API_KEYS[kind], version, make(cls, **common, topic_states=topics)


def stop_replica_errors(request: ControllerRequest, response: Any) -> dict[TopicPartition, int]:
    """Per partition of the request: the broker's error code (a top-level error applies to all)."""
    top = int(response.error_code)
    errors = {(p.topic, p.partition): top for p in request.payload.partitions}
    if top == 0:
        for e in response.partition_errors:
            errors[(e.topic_name, int(e.partition_index))] = int(e.error_code)
    return errors


# -- the broker side --------------------------------------------------------------------------
def partition_states(request: Any, zk_version_field: str = "partition_epoch") -> list[PartitionState]:
    """LeaderAndIsr / UpdateMetadata topic states as plain `PartitionState`s."""
    out = []
    for topic in request.topic_states:
        for s in topic.partition_states:
            out.append(PartitionState(
                topic.topic_name, int(s.partition_index), int(s.controller_epoch), int(s.leader),
                int(s.leader_epoch), tuple(int(r) for r in s.isr), int(getattr(s, zk_version_field)),
                tuple(int(r) for r in s.replicas), tuple(int(r) for r in getattr(s, "adding_replicas", ())),
                tuple(int(r) for r in getattr(s, "removing_replicas", ())),
                tuple(int(r) for r in getattr(s, "offline_replicas", ())), bool(getattr(s, "is_new", False))))
    return out


def topic_ids(request: Any) -> dict:
    return {t.topic_name: t.topic_id for t in request.topic_states if getattr(t, "topic_id", None) is not None}


def live_brokers(request: Any) -> list[BrokerRegistration]:
    out = []
    for b in request.live_brokers:
        endpoint = b.endpoints[0]
        out.append(BrokerRegistration(int(b.id_), endpoint.host, int(endpoint.port), b.rack))
    return out


def controlled_shutdown_request(broker_id: int, broker_epoch: int) -> tuple[int, int, Any]:
    version = VERSIONS["ControlledShutdown"]
    cls = request_schema(7, version)
    return 7, version, make(cls, broker_id=i32(broker_id), broker_epoch=i64(broker_epoch))
