"""The group API handlers' own decisions: ACLs, unknown topics, and per-version answers."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from types import SimpleNamespace

from kio.index import load_request_schema, load_response_schema

from ottla.config import BrokerConfig
from ottla.coordinator.group import GroupCoordinator, StoredRecord
from ottla.errors import ErrorCode
from ottla.producer_state.authorizer import Operation, ResourceType
from ottla.protocol.build import make, nested
from ottla.server.metadata_cache import BrokerInfo, MetadataCache
from ottla.server.handlers import (
    delete_groups,
    describe_groups,
    find_coordinator,
    heartbeat,
    join_group,
    list_groups,
    offset_commit,
    offset_delete,
    offset_fetch,
)

E = ErrorCode
TOPIC_ID = uuid.UUID(int=7)


class Store:
    def __init__(self):
        self.records = []

    def append(self, partition, records, on_durable, *, producer_id=-1, producer_epoch=-1):
        base = len(self.records)
        self.records += [StoredRecord(base + i, k, v, producer_id) for i, (k, v) in enumerate(records)]
        on_durable(E.none, base)

    def load(self, partition):
        return []


class Acl:
    """Denies exactly the (operation, resource type, name) triples it is given."""

    def __init__(self, *denied):
        self.denied = set(denied)

    def authorize(self, principal, operation, resource):
        return (operation, resource.type, resource.name) not in self.denied


def broker(acl):
    coordinator = GroupCoordinator(BrokerConfig({"offsets.topic.num.partitions": 1}), Store())
    coordinator.load_partition(0, now_ms=0)
    metadata = MetadataCache(3, "cluster")
    metadata.local_update(BrokerInfo(3, "broker-host", 9093), [
        ("t", TOPIC_ID, 2), ("secret", uuid.UUID(int=2), 2), ("__consumer_offsets", uuid.UUID(int=3), 1),
        ("__transaction_state", uuid.UUID(int=4), 1)])
    return SimpleNamespace(
        authorizer=acl, node_id=3, connections=set(), metadata=metadata,
        groups=SimpleNamespace(coordinator=coordinator),
    )


def call(module, version, the_broker, **fields):
    request_type = load_request_schema(module.API_KEY, version)
    ctx = SimpleNamespace(broker=the_broker, api_version=version, principal="User:alice", client_id="cli",
                          connection_id="c1", response_type=load_response_schema(module.API_KEY, version))
    return asyncio.run(module.handle(ctx, make(request_type, **fields)))


def nested_of(module, version, class_name, **fields):
    return make(nested(load_request_schema(module.API_KEY, version), class_name), **fields)


def commit(the_broker, version, topics, group="g"):
    built = tuple(nested_of(offset_commit, version, "OffsetCommitRequestTopic", name=name, topic_id=topic_id,
                            partitions=(nested_of(offset_commit, version, "OffsetCommitRequestPartition",
                                                  partition_index=p, committed_offset=5, committed_leader_epoch=1,
                                                  committed_metadata=None),))
                  for name, topic_id, p in topics)
    response = call(offset_commit, version, the_broker, group_id=group, generation_id_or_member_epoch=-1,
                    member_id="", group_instance_id=None, retention_time=timedelta(milliseconds=-1), topics=built)
    return [t.partitions[0].error_code for t in response.topics]


def test_offset_commit_checks_group_and_topic_acls_and_existence():
    b = broker(Acl((Operation.READ, ResourceType.TOPIC, "secret")))
    assert commit(b, 9, [("t", None, 0), ("secret", None, 0), ("t", None, 9), ("nope", None, 0)]) == [
        E.none, E.topic_authorization_failed, E.unknown_topic_or_partition, E.unknown_topic_or_partition]
    assert commit(b, 10, [(None, TOPIC_ID, 1), (None, uuid.UUID(int=9), 0)]) == [E.none, E.unknown_topic_id]
    denied = broker(Acl((Operation.READ, ResourceType.GROUP, "g")))
    assert commit(denied, 9, [("t", None, 0)]) == [E.group_authorization_failed]


def fetch(the_broker, version, topics):
    if version >= 8:
        group = nested_of(offset_fetch, version, "OffsetFetchRequestGroup", group_id="g", member_id=None,
                          member_epoch=-1, topics=None if topics is None else tuple(
                              nested_of(offset_fetch, version, "OffsetFetchRequestTopics", name=n, topic_id=i,
                                        partition_indexes=(0,)) for n, i in topics))
        response = call(offset_fetch, version, the_broker, groups=(group,), require_stable=False)
        return response.groups[0].error_code, response.groups[0].topics
    response = call(offset_fetch, version, the_broker, group_id="g", require_stable=False, topics=None if topics is None
                    else tuple(nested_of(offset_fetch, version, "OffsetFetchRequestTopic", name=n,
                                         partition_indexes=(0,)) for n, _ in topics))
    return getattr(response, "error_code", E.none), response.topics


def test_offset_fetch_hides_what_may_not_be_described():
    b = broker(Acl((Operation.DESCRIBE, ResourceType.TOPIC, "secret")))
    commit(b, 9, [("t", None, 0), ("secret", None, 0)])
    error, topics = fetch(b, 9, None)  # everything: the secret topic is left out
    assert error == E.none and [(t.name, t.partitions[0].committed_offset) for t in topics] == [("t", 5)]
    error, topics = fetch(b, 9, [("t", None), ("secret", None)])
    assert [t.partitions[0].error_code for t in topics] == [E.none, E.topic_authorization_failed]
    error, topics = fetch(b, 10, [(None, TOPIC_ID), (None, uuid.UUID(int=9))])
    assert [(t.partitions[0].error_code, t.partitions[0].committed_offset) for t in topics] == [
        (E.none, 5), (E.unknown_topic_id, -1)]
    denied = broker(Acl((Operation.DESCRIBE, ResourceType.GROUP, "g")))
    assert fetch(denied, 7, [("t", None)])[0] == E.group_authorization_failed
    # v1 has no group-level error: every partition carries it.
    error, topics = fetch(denied, 1, [("t", None)])
    assert error == E.none and topics[0].partitions[0].error_code == E.group_authorization_failed


def test_membership_requests_need_read_on_the_group():
    b = broker(Acl((Operation.READ, ResourceType.GROUP, "g")))
    protocol = nested_of(join_group, 9, "JoinGroupRequestProtocol", name="range", metadata=b"")
    joined = call(join_group, 9, b, group_id="g", session_timeout=timedelta(seconds=10),
                  rebalance_timeout=timedelta(seconds=10), member_id="m", group_instance_id=None,
                  protocol_type="consumer", protocols=(protocol,), reason=None)
    assert (joined.error_code, joined.member_id, joined.generation_id) == (E.group_authorization_failed, "m", -1)
    beat = call(heartbeat, 4, b, group_id="g", generation_id=1, member_id="m", group_instance_id=None)
    assert beat.error_code == E.group_authorization_failed


def test_admin_requests_filter_by_acl():
    b = broker(Acl((Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster"),
                   (Operation.DESCRIBE, ResourceType.GROUP, "hidden"),
                   (Operation.DELETE, ResourceType.GROUP, "kept")))
    for group in ("hidden", "kept", "open"):
        commit(b, 9, [("t", None, 0)], group=group)
    listed = call(list_groups, 5, b, states_filter=(), types_filter=())
    assert sorted(g.group_id for g in listed.groups) == ["kept", "open"]
    described = call(describe_groups, 5, b, groups=("hidden", "open"), include_authorized_operations=False)
    assert [g.error_code for g in described.groups] == [E.group_authorization_failed, E.none]
    deleted = call(delete_groups, 2, b, groups_names=("kept", "open"))
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("kept", E.group_authorization_failed),
                                                                      ("open", E.none)]
    topic = nested_of(offset_delete, 0, "OffsetDeleteRequestTopic", name="t", partitions=(
        nested_of(offset_delete, 0, "OffsetDeleteRequestPartition", partition_index=0),))
    refused = call(offset_delete, 0, b, group_id="kept", topics=(topic,))
    assert refused.error_code == E.group_authorization_failed and refused.topics == ()


def test_find_coordinator_answers_every_key_with_this_node():
    b = broker(Acl((Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, "tx-secret")))
    batched = call(find_coordinator, 6, b, key_type=1, coordinator_keys=("tx", "tx-secret"))
    assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in batched.coordinators] == [
        ("tx", E.none, 3, "broker-host", 9093), ("tx-secret", E.transactional_id_authorization_failed, -1, "", -1)]
    single = call(find_coordinator, 0, b, key="g")
    assert (single.error_code, single.node_id, single.port) == (E.none, 3, 9093)
    share = call(find_coordinator, 6, b, key_type=2, coordinator_keys=("s",))
    assert share.coordinators[0].error_code == E.invalid_request
