"""Three real brokers on a real ZooKeeper: AlterPartitionReassignments v1 (KIP-860) refuses
a change of replication factor when the request forbids one, as Kafka 4's controller does.
"""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.alter_partition_reassignments.v1 import request as apr1
from kio.schema.errors import ErrorCode

from ottla.testing import cluster
from tests.waiting import wait_for
from tests.wire import roundtrip


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    with cluster(brokers=3, root=tmp_path_factory.mktemp("reassign-ids")) as handle:
        yield handle


@pytest.fixture
def zk(three, zk_client):
    yield zk_client(three.connect)
    for handle in three.brokers.values():  # a test that failed midway leaves none down for the next
        if not handle.running():
            handle.start()


def _assignment(zk, topic: str) -> dict[str, list[int]]:
    return json.loads(zk.get(f"/brokers/topics/{topic}")[0])["partitions"]


def _reassign_v1(three, zk, targets: dict[int, list[int]], allow: bool, topic: str):
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    handle = three.brokers[controller]
    request = apr1.AlterPartitionReassignmentsRequest(
        timeout=timedelta(seconds=30), allow_replication_factor_change=allow, topics=(apr1.ReassignableTopic(
            name=topic, partitions=tuple(apr1.ReassignablePartition(partition_index=p, replicas=tuple(r))
                                         for p, r in sorted(targets.items()))),))
    with socket.create_connection((handle.host, handle.port), timeout=60) as sock:
        _, response = roundtrip(sock, request)
    assert response.error_code == ErrorCode.none and response.allow_replication_factor_change is allow
    return {p.partition_index: (p.error_code, p.error_message) for t in response.responses for p in t.partitions}


def test_reassignment_v1_may_forbid_a_replication_factor_change(three, zk):
    topic = "rf-guard"
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replica_assignment=[[1, 2], [2, 3]])])[topic].result(60)
    wait_for(lambda: zk.exists(f"/brokers/topics/{topic}/partitions/1/state"), what="rf-guard's partitions")
    refused = _reassign_v1(three, zk, {0: [1, 2, 3], 1: [3]}, False, topic)
    assert refused == {0: (ErrorCode.invalid_replication_factor, "The replication factor is changed from 2 to 3"),
                       1: (ErrorCode.invalid_replication_factor, "The replication factor is changed from 2 to 1")}
    assert _assignment(zk, topic) == {"0": [1, 2], "1": [2, 3]}
    assert _reassign_v1(three, zk, {0: [2, 3]}, False, topic) == {0: (ErrorCode.none, None)}
    wait_for(lambda: _assignment(zk, topic)["0"] == [2, 3], what="the same-size reassignment to complete")
    assert _reassign_v1(three, zk, {1: [1, 2, 3]}, True, topic) == {1: (ErrorCode.none, None)}
    wait_for(lambda: _assignment(zk, topic)["1"] == [1, 2, 3], what="the allowed change of replication factor")

