"""The group and transaction coordinators on a real ZooKeeper and three real `ottla serve`
processes, with confluent-kafka and kafka-python.

The internal topics are created through the store on the first FindCoordinator and led
by the controller's choice, so every broker names the same coordinator; a group whose
coordinator is on one broker consumes and commits data led by the others, and the commits
survive kill -9 of another broker; a transactional producer whose coordinator is on one
broker commits and aborts on the others' partitions, and kill -9 of the coordinator's
broker resolves the open transaction with nothing lost or twice. Replication factor 1 for
the internal topics: replication is another issue's, so a partition is away while its
broker is down.
"""

from __future__ import annotations

import socket
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaConsumer, TopicPartition as KTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from ottla.coordinator.partitioning import partition_for
from ottla.testing import cluster
from tests.raw_txn_v2 import RawProducer
from tests.wire import roundtrip
from tests.waiting import wait_for

PARTITIONS = 6
GROUP, TRANSACTION = 0, 1
CONFIG = {
    "offsets.topic.num.partitions": PARTITIONS, "offsets.topic.replication.factor": 1,
    "transaction.state.log.num.partitions": PARTITIONS, "transaction.state.log.replication.factor": 1,
}


def find_coordinators(broker, key_type: int, keys: list[str]) -> dict[str, tuple[int, int]]:
    """FindCoordinator v4 (batched) to this one broker: key -> (error code, node id)."""
    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        _, response = roundtrip(sock, FindCoordinatorRequest(key_type=key_type, coordinator_keys=tuple(keys)))
    return {c.key: (int(c.error_code), int(c.node_id)) for c in response.coordinators}


def coordinator_of(three, key_type: int, key: str) -> int:
    """The coordinator every broker agrees on, once there is one."""
    def agreed():
        answers = {b: find_coordinators(h, key_type, [key])[key] for b, h in three.brokers.items() if h.running()}
        nodes = {node for error, node in answers.values() if error == 0}
        if len(nodes) == 1 and all(error == 0 for error, _ in answers.values()):
            return nodes.pop()
        return None
    return wait_for(agreed, what=f"a coordinator for {key!r}")


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    info = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20).topics.get(topic)
    if info is None or info.error is not None:
        return {}
    return {p: m.leader for p, m in info.partitions.items()}


def key_on(three, key_type: int, prefix: str, broker_id: int) -> str:
    """A group or transactional id whose coordinator partition is led by `broker_id`."""
    topic = "__consumer_offsets" if key_type == GROUP else "__transaction_state"
    find_coordinators(three.brokers[1], key_type, [prefix])  # the first request creates the topic
    led = wait_for(lambda: (lambda m: m if len(m) == PARTITIONS and -1 not in m.values() else None)(
        leaders(three.bootstrap, topic)), what=f"{topic} led")
    return next(k for k in (f"{prefix}-{i}" for i in range(10_000)) if led[partition_for(k, PARTITIONS)] == broker_id)


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, config=CONFIG, root=tmp_path_factory.mktemp("coordinators")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


def data_topic(three, name: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(name, 6, 1)])[name].result(60)
    return wait_for(lambda: (lambda m: m if len(m) == 6 and -1 not in m.values() else None)(
        leaders(three.bootstrap, name)), what=f"{name} led")


def test_every_broker_names_the_same_coordinators(three):
    keys = [f"key-{i}" for i in range(40)]
    for key_type in (GROUP, TRANSACTION):
        find_coordinators(three.brokers[2], key_type, keys[:1])
        answers = wait_for(lambda: (lambda a: a if all(e == 0 for r in a for e, _ in r.values()) else None)(
            [find_coordinators(h, key_type, keys) for h in three.brokers.values()]), what="coordinators")
        assert answers[0] == answers[1] == answers[2]
        # Spread over the brokers, as the controller spreads the internal topic's leaders.
        assert {node for _, node in answers[0].values()} == {1, 2, 3}


def test_group_on_one_broker_commits_data_led_by_others_across_a_kill(three):
    led = data_topic(three, "grouped")
    group = key_on(three, GROUP, "readers", 1)
    assert coordinator_of(three, GROUP, group) == 1
    producer = Producer({"bootstrap.servers": three.bootstrap})
    for i in range(60):
        producer.produce("grouped", f"v{i}".encode(), partition=i % 6)
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": three.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["grouped"])
    seen = []
    deadline = time.monotonic() + 90
    while len(seen) < 60 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(60))
    consumer.commit(asynchronous=False)
    consumer.close()

    other = next(b for b in (2, 3) if b in led.values())
    three.brokers[other].kill()
    three.brokers[other].start()
    wait_for(lambda: -1 not in leaders(three.bootstrap, "grouped").values() and
             len(leaders(three.bootstrap, "grouped")) == 6, what="grouped led again")
    reader = KafkaConsumer(bootstrap_servers=three.bootstrap.split(","), group_id=group, enable_auto_commit=False)
    committed = {p: reader.committed(KTopicPartition("grouped", p)) for p in range(6)}
    reader.close()
    assert committed == {p: 10 for p in range(6)}


def read_committed(three, topic: str, partitions: list[int], expected: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=three.bootstrap.split(","), isolation_level="read_committed",
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=5000)
    consumer.assign([KTopicPartition(topic, p) for p in partitions])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        values += [m.value for m in consumer]
        if len(values) >= expected:
            values += [m.value for m in consumer]  # anything beyond would be a bug: look once more
            break
    consumer.close()
    return values


def transactional(three, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": three.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    return producer


def test_transactions_on_one_broker_with_data_on_others_survive_its_kill(three):
    led = data_topic(three, "txdata")
    txn_id = key_on(three, TRANSACTION, f"copier-{uuid.uuid4().hex[:6]}", 3)
    assert coordinator_of(three, TRANSACTION, txn_id) == 3
    targets = sorted(p for p, b in led.items() if b != 3)

    def batch(producer, tag: str, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(10):
            producer.produce("txdata", f"{tag}{i}".encode(), partition=targets[i % len(targets)])
        (producer.commit_transaction if commit else producer.abort_transaction)(60)

    producer = transactional(three, txn_id)
    batch(producer, "a", True)
    batch(producer, "b", False)
    batch(producer, "c", True)
    # An open transaction when the coordinator's broker dies: the next session aborts it.
    producer.begin_transaction()
    for i in range(5):
        producer.produce("txdata", f"open{i}".encode(), partition=targets[i % len(targets)])
    assert producer.flush(60) == 0
    three.brokers[3].kill()
    three.brokers[3].start()
    assert coordinator_of(three, TRANSACTION, txn_id) == 3
    producer = transactional(three, txn_id)
    batch(producer, "d", True)
    expected = sorted(f"{t}{i}".encode() for t in "acd" for i in range(10))
    assert sorted(read_committed(three, "txdata", targets, len(expected))) == expected


def test_transactions_version_2_adds_partitions_through_their_leaders(three):
    """A Java 4.x producer's requests (raw frames): its data partition led by broker 1, its
    group by broker 2 and its transactional id by broker 3, so broker 1 (Produce v12) and
    broker 2 (TxnOffsetCommit v5) add the partitions with AddPartitionsToTxn v5 to broker 3."""
    led = data_topic(three, "tv2data")
    partition = next(p for p, b in led.items() if b == 1)
    txn_id = key_on(three, TRANSACTION, "tv2", 3)
    group = key_on(three, GROUP, "tv2-group", 2)
    assert (coordinator_of(three, TRANSACTION, txn_id), coordinator_of(three, GROUP, group)) == (3, 2)

    def connect(broker_id):
        host, port = three.brokers[broker_id].bootstrap.rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=60)

    with connect(3) as coordinator, connect(1) as leader, connect(2) as groups:
        producer = RawProducer(coordinator, "tv2data", transactional_id=txn_id, partition=partition,
                               leader=leader, group=groups)
        producer.init()
        epoch = producer.epoch
        assert producer.produce(b"tv2-a")[0] == ErrorCode.none
        assert producer.commit_offsets(group, 7) == ErrorCode.none
        assert producer.end(commit=True).producer_epoch == epoch + 1
        # Once the markers are written: before, the leader's log still holds the transaction at
        # the old epoch, and a write of it joins it without asking the coordinator, as in Kafka.
        producer.settled()
        assert producer.produce(b"late", epoch=epoch, sequence=1)[0] == ErrorCode.invalid_producer_epoch
        assert producer.produce(b"tv2-b")[0] == ErrorCode.none
        assert producer.end(commit=True).producer_epoch == epoch + 2
    assert sorted(read_committed(three, "tv2data", [partition], 2)) == [b"tv2-a", b"tv2-b"]
    consumer = Consumer({"bootstrap.servers": three.bootstrap, "group.id": group})
    try:
        assert wait_for(lambda: consumer.committed([TopicPartition("tv2data", partition)], timeout=30)[0].offset == 7,
                        what="the offset committed in the transaction")
    finally:
        consumer.close()


def test_no_coordinator_until_enough_brokers_for_the_replication_factor(tmp_path):
    """Default factor 3 on two live brokers: Kafka refuses to create the internal topic and
    FindCoordinator answers COORDINATOR_NOT_AVAILABLE; a third broker lets it through. The
    transaction log takes its min.insync.replicas from transaction.state.log.min.isr (set to 3
    here), the offsets topic 2."""
    sizes = {"offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 3,
             "transaction.state.log.min.isr": 3}
    with cluster(brokers=2, config=sizes, root=tmp_path) as two:
        for broker in two.brokers.values():
            assert find_coordinators(broker, GROUP, ["g"])["g"] == (15, -1)  # COORDINATOR_NOT_AVAILABLE
            assert find_coordinators(broker, TRANSACTION, ["t"])["t"] == (15, -1)
        two.add_broker()
        for key_type, key in ((GROUP, "g"), (TRANSACTION, "t")):
            node = coordinator_of(two, key_type, key)
            assert node in (1, 2, 3)
        replicas = AdminClient({"bootstrap.servers": two.bootstrap}).list_topics(timeout=20).topics
        assert all(len(p.replicas) == 3 for t in ("__consumer_offsets", "__transaction_state")
                   for p in replicas[t].partitions.values())
        admin = AdminClient({"bootstrap.servers": two.bootstrap})
        resources = {t: ConfigResource(ConfigResource.Type.TOPIC, t) for t in ("__consumer_offsets", "__transaction_state")}
        described = admin.describe_configs(list(resources.values()))
        assert {t: described[r].result(20)["min.insync.replicas"].value for t, r in resources.items()} == {
            "__consumer_offsets": "2", "__transaction_state": "3"}
