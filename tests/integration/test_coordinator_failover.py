"""Coordinator failover with replication factor 3, on a real ZooKeeper and three real
`ottla serve` processes: kill -9 of the broker leading a group's `__consumer_offsets`
partition, and of the broker leading a transactional id's `__transaction_state` partition.

A commit the old coordinator acknowledged is on the new one (it answered only once the
record was replicated to the ISR); a transaction open when its coordinator dies ends whole,
committed or aborted, never half. The killed broker is never the controller, so these
tests watch the coordinators' failover, not the controller's; the last test, on one broker,
kills the controller-coordinator itself between PrepareCommit and the markers.
"""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError as KafkaPythonError

from ottla.admin_client import AdminProtocolClient
from ottla.coordinator.partitioning import partition_for
from ottla.testing import cluster
from tests.transactional_reads import read_all, wait_until_stable
from tests.waiting import wait_for

INTERNAL = 6
CONFIG = {"min.insync.replicas": 2, "group.initial.rebalance.delay.ms": 0,
          "offsets.topic.num.partitions": INTERNAL, "transaction.state.log.num.partitions": INTERNAL}
LIMIT_S = 180   # guards against hangs only


@pytest.fixture
def three(tmp_path):
    with cluster(brokers=3, config=CONFIG, root=tmp_path / "cluster") as handle:
        yield handle


def controller_id(admin: AdminClient) -> int:
    def ask():
        try:
            return admin.describe_cluster(request_timeout=10).result(60).controller.id
        except KafkaException:
            return -1
    return wait_for(lambda: (lambda c: c if c >= 0 else None)(ask()), timeout=LIMIT_S, what="a controller")


def leaders(admin: AdminClient, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, ISR size)."""
    try:
        info = admin.list_topics(topic, timeout=10).topics.get(topic)
    except KafkaException:
        return {}
    if info is None or info.error is not None:
        return {}
    return {p: (m.leader, len(m.isrs)) for p, m in info.partitions.items()}


def fully_replicated(admin: AdminClient, topic: str, count: int) -> dict[int, int] | None:
    led = leaders(admin, topic)
    if len(led) == count and all(leader >= 0 and isr == 3 for leader, isr in led.values()):
        return {p: leader for p, (leader, _) in led.items()}
    return None


def data_topic(admin: AdminClient, name: str) -> None:
    admin.create_topics([NewTopic(name, 3, 3)], request_timeout=60)[name].result(60)
    wait_for(lambda: fully_replicated(admin, name, 3), timeout=LIMIT_S, what=f"{name} fully replicated")


def key_led_by(admin: AdminClient, internal_topic: str, prefix: str, broker_id: int) -> str:
    """A group or transactional id whose partition of `internal_topic` `broker_id` leads."""
    led = wait_for(lambda: fully_replicated(admin, internal_topic, INTERNAL), timeout=LIMIT_S,
                   what=f"{internal_topic} fully replicated")
    return next(k for k in (f"{prefix}-{i}" for i in range(10_000)) if led[partition_for(k, INTERNAL)] == broker_id)


def test_an_acknowledged_commit_survives_kill_of_the_group_coordinator(three):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    victim = next(b for b in three.brokers if b != controller_id(admin))
    data_topic(admin, "gf-data")
    records = 3000
    producer = Producer({"bootstrap.servers": three.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(records):
        producer.produce("gf-data", value=b"%d" % i, partition=i % 3)
    assert producer.flush(60) == 0

    # The first FindCoordinator creates __consumer_offsets; then pick a group the victim leads.
    probe = Consumer({"bootstrap.servers": three.bootstrap, "group.id": "gf-probe"})
    probe.committed([TopicPartition("gf-data", 0)], timeout=60)
    probe.close()
    group = key_led_by(admin, "__consumer_offsets", "gf-group", victim)
    consumer = Consumer({"bootstrap.servers": three.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 45000})
    consumer.subscribe(["gf-data"])
    seen: list[int] = []

    def consume_and_commit() -> dict[int, int]:
        """One batch, then a synchronous commit of the positions, retried until acknowledged;
        returns the offsets acknowledged."""
        for message in consumer.consume(200, 1.0):
            if message.error() is None:
                seen.append(int(message.value()))
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        if not positions:
            return {}
        while True:
            try:
                consumer.commit(offsets=positions, asynchronous=False)
            except KafkaException as exc:
                assert not exc.args[0].fatal(), exc   # e.g. NOT_COORDINATOR while it moves: retry
                continue
            return {tp.partition: tp.offset for tp in positions}

    acked: dict[int, int] = {}
    while len(seen) < records // 3:
        acked = consume_and_commit() or acked
    assert sum(acked.values()) == len(seen)
    three.brokers[victim].kill()   # at once: the commit was acknowledged, so it is on the ISR

    def committed_on_new_coordinator() -> dict[int, int] | None:
        try:
            client = KafkaAdminClient(bootstrap_servers=three.bootstrap.split(","), request_timeout_ms=20000)
        except KafkaPythonError:
            return None
        try:
            offsets = client.list_group_offsets({group: [KafkaTopicPartition("gf-data", p) for p in range(3)]})[group]
        except KafkaPythonError:
            return None
        finally:
            client.close()
        return {tp.partition: meta.offset for tp, meta in offsets.items() if meta.offset >= 0} or None

    assert wait_for(committed_on_new_coordinator, timeout=LIMIT_S, what="the commits from the new coordinator") == acked

    three.brokers[victim].start()
    while len(seen) < records:
        acked = consume_and_commit() or acked
    consumer.close()
    assert sorted(seen) == list(range(records))   # every record once: no commit was lost
    assert sum(acked.values()) == records
    assert wait_for(committed_on_new_coordinator, timeout=LIMIT_S, what="the final commits") == acked


def test_an_open_transaction_ends_whole_after_kill_of_the_transaction_coordinator(three):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    victim = next(b for b in three.brokers if b != controller_id(admin))
    data_topic(admin, "tf-data")

    def transactional(txn_id: str) -> Producer:
        producer = Producer({"bootstrap.servers": three.bootstrap, "transactional.id": txn_id,
                             "transaction.timeout.ms": 60000, "linger.ms": 5})
        producer.init_transactions(LIMIT_S)
        return producer

    transactional("tf-probe")   # creates __transaction_state
    txn_id = key_led_by(admin, "__transaction_state", "tf-txn", victim)
    producer = transactional(txn_id)
    committed: list[bytes] = []

    def write(tag: str) -> list[bytes]:
        values = [b"%s-%d" % (tag.encode(), i) for i in range(30)]
        producer.begin_transaction()
        for i, value in enumerate(values):
            producer.produce("tf-data", value=value, partition=i % 3)
        assert producer.flush(60) == 0
        return values

    for t in range(3):
        values = write(f"before{t}")
        producer.commit_transaction(60)
        committed += values

    in_flight = write("in-flight")   # its records are in the data partitions' logs
    three.brokers[victim].kill()
    outcome = None
    while outcome is None:
        try:
            producer.commit_transaction(LIMIT_S)
            outcome = "committed"
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(LIMIT_S)
                outcome = "aborted"
            elif error.fatal():
                producer = transactional(txn_id)   # fences the old producer: its transaction aborts
                outcome = "aborted"
            else:
                assert error.retriable(), error
    if outcome == "committed":
        committed += in_flight
    three.brokers[victim].start()
    values = write("after")
    producer.commit_transaction(LIMIT_S)
    committed += values

    partitions = [TopicPartition("tf-data", p) for p in range(3)]
    wait_until_stable(three.bootstrap, partitions)
    seen = Counter(value for _, _, _, value in read_all(three.bootstrap, partitions, "read_committed"))
    assert seen == Counter(committed), f"in-flight transaction {outcome}"

    def state() -> str | None:
        try:
            with AdminProtocolClient(three.bootstrap) as client:
                return client.describe_transaction(txn_id)[1].transaction_state
        except Exception:   # the coordinator may still be loading
            return None
    assert wait_for(state, timeout=LIMIT_S, what="the transaction's state") == "CompleteCommit"


def test_a_commit_prepared_before_kill_9_completes_with_every_marker_after_a_restart_at_once(tmp_path):
    """One broker of a ZooKeeper cluster (the controller, the transaction coordinator and the
    data's leader) kills itself between PrepareCommit and the markers (failpoint) and is
    restarted at once. It takes `__transaction_state` back on LeaderAndIsr and rolls the commit
    forward right away, so its metadata must know the data topic by then: the controller's
    UpdateMetadata goes first, as Kafka's. It went second, and the coordinator skipped the
    unknown partitions as deleted topics: CompleteCommit with the data's transaction still
    open (the copier test lost the output of a committed transaction that way)."""
    config = {"offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1}
    with cluster(brokers=1, config=config, root=tmp_path / "cluster") as one:
        broker = one.brokers[1]
        broker.env = {"OTTLA_FAILPOINTS": "txn.after_prepare_commit"}
        broker.restart()
        bootstrap = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("prepared", 2, 1)])["prepared"].result(60)
        partitions = [TopicPartition("prepared", p) for p in range(2)]
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "prepared", "linger.ms": 5})
        producer.init_transactions(60)
        producer.begin_transaction()
        for i in range(20):
            producer.produce("prepared", value=b"%d" % i, partition=i % 2)
        assert producer.flush(60) == 0
        try:
            producer.commit_transaction(5)
        except KafkaException:
            pass   # the broker may die before its EndTxn answer gets out
        assert broker.process.wait(60) == -9
        broker.env = {}
        broker.start()

        def completed():
            with AdminProtocolClient(bootstrap) as client:
                _, state = client.describe_transaction("prepared")
            return state.transaction_state == "CompleteCommit"
        wait_for(completed, timeout=LIMIT_S, what="the commit completed")
        with AdminProtocolClient(bootstrap) as client:
            open_transactions = {p: [s.current_txn_start_offset for s in states if s.current_txn_start_offset >= 0]
                                 for p, states in client.describe_producers("prepared", [0, 1]).items()}
        assert open_transactions == {0: [], 1: []}
        assert sorted(v for _, _, _, v in read_all(bootstrap, partitions, "read_committed")) == sorted(
            b"%d" % i for i in range(20))
