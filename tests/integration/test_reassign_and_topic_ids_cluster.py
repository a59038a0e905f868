"""Three real brokers on a real ZooKeeper: AlterPartitionReassignments v1 (KIP-860) refuses
a change of replication factor when the request forbids one, as Kafka 4's controller does; a
LeaderAndIsr naming another topic id than the local log's is refused INCONSISTENT_TOPIC_ID and
the log kept, as Kafka's ZooKeeper-mode broker does, while a topic deleted and recreated while
a replica's broker was down still reaches it, through the deletion's StopReplica.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from datetime import timedelta

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.alter_partition_reassignments.v1 import request as apr1
from kio.schema.errors import ErrorCode

from ottla.admin_client import AdminProtocolClient
from ottla.testing import cluster
from tests.waiting import wait_for
from tests.wire import roundtrip


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, root=tmp_path_factory.mktemp("reassign-ids")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


@pytest.fixture
def zk(three, zk_client):
    return zk_client(three.connect)


def _reassign(three, topic: str, replicas: list[int]) -> None:
    with AdminProtocolClient(three.bootstrap, timeout=20) as client:
        client.alter_partition_reassignment(topic, 0, replicas, timeout_ms=30000)


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


def _local_topic_ids(handle, topic: str) -> set[str]:
    """The topic ids of `topic` in a broker's local catalog (`.topics/<id>.json`)."""
    found = set()
    for entry in (handle.data_dir / ".topics").glob("*.json"):
        data = json.loads(entry.read_text())
        if data.get("name") == topic:
            found.add(entry.stem)
    return found


def _topic_id(zk, topic: str) -> str:
    """The topic id ZooKeeper holds (Kafka's base64), as the catalog names it (a UUID)."""
    encoded = json.loads(zk.get(f"/brokers/topics/{topic}")[0])["topic_id"]
    return str(uuid.UUID(bytes=base64.urlsafe_b64decode(encoded + "==")))


def _produce(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(60) == 0


def _down(three, zk, broker_id: int) -> None:
    three.brokers[broker_id].kill()
    wait_for(lambda: not zk.exists(f"/brokers/ids/{broker_id}"), what=f"broker {broker_id}'s session to end")


def _not_controller(zk, three) -> tuple[int, list[int]]:
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    down = next(b for b in sorted(three.brokers) if b != controller)
    return down, [b for b in sorted(three.brokers) if b != down]


def test_a_leader_and_isr_of_another_topic_id_keeps_the_local_log(three, zk):
    """A broker down while its replica was moved away and the topic deleted and recreated
    (the deletion did not wait for it: it held no replica any more) keeps the old topic's log.
    When the recreated topic is reassigned onto it, its LeaderAndIsr names the new topic id:
    the broker answers INCONSISTENT_TOPIC_ID and keeps the old log, as Kafka's ZooKeeper-mode
    broker does, instead of replacing it."""
    topic = "other-id"
    down, (keeper, other) = _not_controller(zk, three)
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[down, keeper]])])[topic].result(60)
    wait_for(lambda: zk.exists(f"/brokers/topics/{topic}/partitions/0/state"), what="other-id's partition")
    _produce(three.bootstrap, topic, 20)
    old_id = _topic_id(zk, topic)
    _down(three, zk, down)
    _reassign(three, topic, [keeper, other])
    wait_for(lambda: _assignment(zk, topic)["0"] == [keeper, other], what="the move off the down broker")
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    wait_for(lambda: not zk.exists(f"/brokers/topics/{topic}"), what="the deletion to complete")
    wait_for(lambda: admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[keeper, other]])])[
        topic].exception(60) is None, what="the recreation")
    new_id = _topic_id(zk, topic)
    assert new_id != old_id
    three.brokers[down].start()
    wait_for(lambda: zk.exists(f"/brokers/ids/{down}"), what="the broker to register again")
    assert _local_topic_ids(three.brokers[down], topic) == {old_id}  # not a stray: another id
    _reassign(three, topic, [keeper, other, down])
    wait_for(lambda: "INCONSISTENT_TOPIC_ID" in three.brokers[down].stderr_path.read_text(errors="replace"),
             what="the returned broker to refuse the LeaderAndIsr of the new topic id")
    assert _local_topic_ids(three.brokers[down], topic) == {old_id}
    assert sum(f.stat().st_size for f in (three.brokers[down].data_dir / f"{topic}-0").glob("*.log")) > 0
    # The operator's way out: take the broker off the partition again.
    _reassign(three, topic, [keeper, other])


def test_a_topic_deleted_and_recreated_while_a_replica_was_down_is_replaced_through_deletion(three, zk):
    """The legitimate case: the deletion waits for the down broker, whose StopReplica
    (delete) removes the old log when it returns; the topic recreated after that lands on it
    under the new id and serves the new records only."""
    from confluent_kafka import Consumer
    topic = "recreated"
    down, (keeper, _) = _not_controller(zk, three)
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[down, keeper]])])[topic].result(60)
    wait_for(lambda: zk.exists(f"/brokers/topics/{topic}/partitions/0/state"), what="recreated's partition")
    _produce(three.bootstrap, topic, 30)
    old_id = _topic_id(zk, topic)
    _down(three, zk, down)
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    three.brokers[down].start()
    wait_for(lambda: not zk.exists(f"/brokers/topics/{topic}"), what="the deletion to complete")
    wait_for(lambda: admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[down, keeper]])])[
        topic].exception(60) is None, what="the recreation")
    new_id = _topic_id(zk, topic)
    assert new_id != old_id
    wait_for(lambda: _local_topic_ids(three.brokers[down], topic) == {new_id},
             what="the new topic's log on the returned broker")
    _produce(three.bootstrap, topic, 5)
    reader = Consumer({"bootstrap.servers": three.brokers[down].bootstrap, "group.id": "recreated-reader",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.subscribe([topic])
    seen = []
    wait_for(lambda: seen.extend(m.value() for m in reader.consume(10, 1.0) if m.error() is None) or len(seen) >= 5,
             what="the new records")
    reader.close()
    assert seen == [b"%d" % i for i in range(5)]
