"""Every version of the group APIs on the wire, including where old versions answer differently."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from ottla.protocol.build import make, nested
from tests.wire import roundtrip

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, METADATA = 13, 14, 15, 16, 3
DELETE_GROUPS, OFFSET_DELETE = 42, 47
TOPIC = "wired"
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x05wired\xff\xff\xff\xff"  # ConsumerProtocolSubscription v0


def request(api_key, version, **fields):
    return make(load_request_schema(api_key, version), **fields)


def part(api_key, version, class_name, **fields):
    return make(nested(load_request_schema(api_key, version), class_name), **fields)


@pytest.fixture
def wire(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 0, "num.partitions": 2})
    sock = raw_connection(broker.bootstrap)
    # Metadata auto-creates the topic; its id is what OffsetCommit/OffsetFetch v10 use.
    _, metadata = roundtrip(sock, request(METADATA, 12, topics=(part(METADATA, 12, "MetadataRequestTopic",
                                                                     topic_id=None, name=TOPIC),),
                                          allow_auto_topic_creation=True, include_topic_authorized_operations=False))
    return sock, metadata.topics[0].topic_id


def join(sock, version, group, member_id="", instance=None):
    protocol = part(JOIN_GROUP, version, "JoinGroupRequestProtocol", name="range", metadata=SUBSCRIPTION)
    return roundtrip(sock, request(JOIN_GROUP, version, group_id=group, session_timeout=timedelta(seconds=10),
                                   rebalance_timeout=timedelta(seconds=10), member_id=member_id,
                                   group_instance_id=instance, protocol_type="consumer", protocols=(protocol,),
                                   reason="test"))[1]


@pytest.mark.parametrize("version", range(10))
def test_membership_cycle_at_every_version(wire, version):
    sock, _ = wire
    group = f"cycle-{version}"
    sync_v, heartbeat_v, leave_v, describe_v = version % 6, version % 5, version % 6, version % 7
    first = join(sock, version, group)
    if version >= 4:  # KIP-394
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        first = join(sock, version, group, member_id=first.member_id)
    assert first.error_code == ErrorCode.none
    assert (first.generation_id, first.leader, first.protocol_name) == (1, first.member_id, "range")
    assert [m.metadata for m in first.members] == [SUBSCRIPTION]
    if version >= 7:
        assert first.protocol_type == "consumer"
    member = first.member_id

    assignment = part(SYNC_GROUP, sync_v, "SyncGroupRequestAssignment", member_id=member, assignment=b"mine")
    _, synced = roundtrip(sock, request(SYNC_GROUP, sync_v, group_id=group, generation_id=1, member_id=member,
                                        group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                        assignments=(assignment,)))
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"mine")

    _, beat = roundtrip(sock, request(HEARTBEAT, heartbeat_v, group_id=group, generation_id=1, member_id=member,
                                      group_instance_id=None))
    assert beat.error_code == ErrorCode.none
    _, stale = roundtrip(sock, request(HEARTBEAT, heartbeat_v, group_id=group, generation_id=0, member_id=member,
                                       group_instance_id=None))
    assert stale.error_code == ErrorCode.illegal_generation

    _, described = roundtrip(sock, request(DESCRIBE_GROUPS, describe_v, groups=(group,),
                                           include_authorized_operations=False))
    d = described.groups[0]
    assert (d.error_code, d.group_state, d.protocol_type, d.protocol_data) == (ErrorCode.none, "Stable", "consumer",
                                                                               "range")
    assert [(m.member_id, m.member_metadata, m.member_assignment) for m in d.members] == [
        (member, SUBSCRIPTION, b"mine")]
    assert d.members[0].client_host == "/127.0.0.1"

    if leave_v >= 3:
        identity = part(LEAVE_GROUP, leave_v, "MemberIdentity", member_id=member, group_instance_id=None, reason="bye")
        _, left = roundtrip(sock, request(LEAVE_GROUP, leave_v, group_id=group, members=(identity,)))
        assert [m.error_code for m in left.members] == [ErrorCode.none]
    else:
        _, left = roundtrip(sock, request(LEAVE_GROUP, leave_v, group_id=group, member_id=member))
        _, unknown = roundtrip(sock, request(LEAVE_GROUP, leave_v, group_id=group, member_id=member))
        assert unknown.error_code == ErrorCode.unknown_member_id  # the member's error is the request's
    assert left.error_code == ErrorCode.none
    _, described = roundtrip(sock, request(DESCRIBE_GROUPS, describe_v, groups=(group,),
                                           include_authorized_operations=False))
    assert described.groups[0].group_state == "Empty"


def test_join_group_v0_uses_the_session_timeout_for_the_rebalance(wire):
    sock, _ = wire
    result = join(sock, 0, "old")
    assert result.error_code == ErrorCode.none and result.generation_id == 1


def _commit(sock, version, group, topic_id, offset, generation=-1, member=""):
    partition = part(OFFSET_COMMIT, version, "OffsetCommitRequestPartition", partition_index=1,
                     committed_offset=offset, committed_leader_epoch=0, committed_metadata="meta")
    topic = part(OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name=TOPIC, topic_id=topic_id,
                 partitions=(partition,))
    _, response = roundtrip(sock, request(OFFSET_COMMIT, version, group_id=group, generation_id_or_member_epoch=generation,
                                          member_id=member, group_instance_id=None,
                                          retention_time=timedelta(milliseconds=-1), topics=(topic,)))
    return response.topics[0].partitions[0].error_code


def _fetch(sock, version, group, topic_id, partitions=(1,)):
    if version >= 8:
        topics = (part(OFFSET_FETCH, version, "OffsetFetchRequestTopics", name=TOPIC, topic_id=topic_id,
                       partition_indexes=partitions),)
        group_request = part(OFFSET_FETCH, version, "OffsetFetchRequestGroup", group_id=group, member_id=None,
                             member_epoch=-1, topics=topics)
        _, response = roundtrip(sock, request(OFFSET_FETCH, version, groups=(group_request,), require_stable=True))
        return response.groups[0].error_code, response.groups[0].topics
    topics = (part(OFFSET_FETCH, version, "OffsetFetchRequestTopic", name=TOPIC, partition_indexes=partitions),)
    _, response = roundtrip(sock, request(OFFSET_FETCH, version, group_id=group, topics=topics, require_stable=True))
    return getattr(response, "error_code", ErrorCode.none), response.topics


@pytest.mark.parametrize("version", range(2, 11))
def test_offset_commit_and_fetch_at_every_version(wire, version):
    sock, topic_id = wire
    group = f"offsets-{version}"
    assert _commit(sock, version, group, topic_id, 40 + version) == ErrorCode.none
    fetch_version = version if version > 2 else 1
    for v in {fetch_version, 10}:
        error, topics = _fetch(sock, v, group, topic_id)
        assert error == ErrorCode.none
        p = topics[0].partitions[0]
        assert (p.error_code, p.committed_offset, p.metadata) == (ErrorCode.none, 40 + version, "meta")


def test_old_versions_map_errors_as_kafka_does(wire):
    sock, topic_id = wire
    # A commit with a generation to a group that does not exist.
    assert _commit(sock, 8, "ghost", topic_id, 1, generation=3, member="m") == ErrorCode.illegal_generation
    assert _commit(sock, 9, "ghost", topic_id, 1, generation=3, member="m") == ErrorCode.group_id_not_found
    # Topics that do not exist.
    partition = part(OFFSET_COMMIT, 10, "OffsetCommitRequestPartition", partition_index=0, committed_offset=1,
                     committed_leader_epoch=0, committed_metadata=None)
    unknown_id = part(OFFSET_COMMIT, 10, "OffsetCommitRequestTopic", topic_id=topic_id.__class__(int=1),
                      partitions=(partition,))
    _, response = roundtrip(sock, request(OFFSET_COMMIT, 10, group_id="g", generation_id_or_member_epoch=-1,
                                          member_id="", group_instance_id=None, topics=(unknown_id,)))
    assert response.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_id
    assert _commit(sock, 9, "g", None, 1) == ErrorCode.none
    # DescribeGroups of an unknown group: Dead, and an error only from v6.
    for version, error in ((5, ErrorCode.none), (6, ErrorCode.group_id_not_found)):
        _, described = roundtrip(sock, request(DESCRIBE_GROUPS, version, groups=("nobody",),
                                               include_authorized_operations=False))
        assert (described.groups[0].error_code, described.groups[0].group_state) == (error, "Dead")
    # OffsetFetch of everything a group committed (null topics), then by topic id.
    _, everything = roundtrip(sock, request(OFFSET_FETCH, 7, group_id="g", topics=None, require_stable=False))
    assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in everything.topics] == [
        (TOPIC, [(1, 1)])]


def test_list_find_delete_and_offset_delete(wire):
    sock, topic_id = wire
    _commit(sock, 9, "idle", topic_id, 5)
    assert join(sock, 3, "live").error_code == ErrorCode.none
    for version in range(6):
        _, listed = roundtrip(sock, request(LIST_GROUPS, version, states_filter=(), types_filter=()))
        assert listed.error_code == ErrorCode.none
        assert sorted(g.group_id for g in listed.groups) == ["idle", "live"]
    _, stable_only = roundtrip(sock, request(LIST_GROUPS, 5, states_filter=("Empty",), types_filter=("classic",)))
    assert [(g.group_id, g.group_state, g.group_type) for g in stable_only.groups] == [("idle", "Empty", "classic")]

    for version in range(7):
        keys = dict(coordinator_keys=("live", "txn-id")) if version >= 4 else dict(key="live")
        _, found = roundtrip(sock, request(FIND_COORDINATOR, version, key_type=0, **keys))
        answers = found.coordinators if version >= 4 else [found]
        assert {(a.error_code, a.node_id) for a in answers} == {(ErrorCode.none, 0)}

    topic = make(nested(load_request_schema(OFFSET_DELETE, 0), "OffsetDeleteRequestTopic"), name=TOPIC, partitions=(
        make(nested(load_request_schema(OFFSET_DELETE, 0), "OffsetDeleteRequestPartition"), partition_index=1),))
    _, deleted = roundtrip(sock, request(OFFSET_DELETE, 0, group_id="idle", topics=(topic,)))
    assert deleted.error_code == ErrorCode.none
    assert deleted.topics[0].partitions[0].error_code == ErrorCode.none
    _, busy = roundtrip(sock, request(OFFSET_DELETE, 0, group_id="live", topics=(topic,)))
    assert busy.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic

    _commit(sock, 9, "idle-2", topic_id, 5)
    for version in range(3):
        _, results = roundtrip(sock, request(DELETE_GROUPS, version, groups_names=("idle-2", "live", "missing")))
        errors = {r.group_id: r.error_code for r in results.results}
        assert errors["live"] == ErrorCode.non_empty_group and errors["missing"] == ErrorCode.group_id_not_found
        assert errors["idle-2"] == (ErrorCode.none if version == 0 else ErrorCode.group_id_not_found)
