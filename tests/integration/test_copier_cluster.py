"""The exactly-once copier on three real brokers while the brokers under it are bounced, in
the spirit of Kafka's transactions system test (`transactions_test.py`).

A copier process (consume read_committed, produce, send the offsets to the transaction,
commit; every 7th transaction aborted on purpose), once with kafka-python (kp_copier.py)
and once with librdkafka (copier.py), copies an input topic of numbered records to an
output topic, both 3 partitions with replication factor 3 and min.insync.replicas=2.
Meanwhile the test bounces, one at a time and each with kill -9 or with a clean SIGTERM
(controlled shutdown) restart: the leader of an input partition, of an output partition,
of the copier's `__transaction_state` partition, of its group's `__consumer_offsets`
partition, and the controller; and kills the copier itself. A read_committed reader
(librdkafka) runs all along. At the end the output read read_committed is the input
exactly once, and the reader never saw a record of an aborted transaction. A copier that
ends (fenced, or its watchdog after a client hang, see the copiers) is started again, as
a supervisor would.

On the same cluster, the copier again over topics with replication factor 1, one
partition per broker: kill -9 of a broker leaves its partitions without a leader
(LEADER_NOT_AVAILABLE) while the copier goes on with the others; once it is back, nothing
acknowledged is lost and nothing is there twice.

Found here too: a follower that had led an epoch without writing in it kept that epoch
after truncating and fetched with it forever (Log.truncate_to, KAFKA-7415); a broker
restarted right after kill -9 answered Metadata naming itself alone before it had
registered (test_cluster_membership.py); a restarted broker that kept leading its
`__transaction_state` partition completed a prepared commit without the output
partition's marker, its metadata not knowing the topic yet (the controller sent
LeaderAndIsr before UpdateMetadata, test_controller.py): 20 records lost. Client bugs met
here, and what the copiers do about them: docs/compatibility.md.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError as KafkaPythonError
from kafka.errors import for_code
from kio.schema.errors import ErrorCode as KafkaErrorCode

from ottla.admin_client import AdminProtocolClient, ProtocolClientError
from ottla.coordinator.partitioning import partition_for
from ottla.testing import cluster
from tests.transactional_reads import read_all, wait_until_stable
from tests.waiting import wait_for

HERE = Path(__file__).parent
INTERNAL = 3
CONFIG = {"replica.lag.time.max.ms": 3000, "replica.fetch.backoff.ms": 200, "group.initial.rebalance.delay.ms": 0,
          "offsets.topic.num.partitions": INTERNAL, "transaction.state.log.num.partitions": INTERNAL,
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": 2000}
PARTITIONS = 3
CHUNK = 400          # input records added before each bounce
LIMIT_S = 180        # guards against hangs only
# client -> the copier's command after BOOTSTRAP INPUT OUTPUT --group G --transactional-id T
COPIERS = {
    "kafka-python": [str(HERE / "kp_copier.py"), "--commit-every", "20", "--abort-every", "7", "--pause-ms", "20"],
    # A session past a coordinator's kill -9 (ZooKeeper session and election), see copier.py;
    # `--debug eos,cgrp,broker,metadata` added here shows librdkafka's side in copier.log.
    "confluent-kafka": [str(HERE / "copier.py"), "--commit-every", "20", "--abort-every", "7", "--pause-ms", "20",
                        "--session-timeout-ms", "20000", "--timeout-s", "20"],
}
# (what is bounced, how): the coordinators and the controller both ways, the data leaders one
# way each; every role twice would double the run.
BOUNCES = [("input", "kill"), ("transaction", "term"), ("copier", "kill"), ("group", "kill"),
           ("output", "term"), ("controller", "kill"), ("transaction", "kill"), ("group", "term"),
           ("controller", "term")]


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, config=CONFIG, root=tmp_path_factory.mktemp("copier")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


def leaders(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, ISR size), {} while Metadata cannot answer."""
    try:
        info = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
    except KafkaException:
        return {}
    if info is None or info.error is not None:
        return {}
    return {p: (m.leader, len(m.isrs)) for p, m in info.partitions.items()}


def in_sync(bootstrap: str, topics: dict[str, int]) -> bool:
    """Every partition of `topics` led, with all three replicas in its ISR."""
    for topic, count in topics.items():
        led = leaders(bootstrap, topic)
        if len(led) != count or any(leader < 0 or isr != 3 for leader, isr in led.values()):
            return False
    return True


def controller(bootstrap: str) -> int | None:
    try:
        found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).controller_id
    except KafkaException as exc:
        print(f"no controller from Metadata: {exc}")
        return None
    if found < 0:
        print(f"Metadata names controller {found}")
    return found if found >= 0 else None


class Reader(threading.Thread):
    """A read_committed consumer of the output from start to end (librdkafka, where the copier
    is kafka-python), keeping every value it is given."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-reader",
                                  "isolation.level": "read_committed", "enable.auto.commit": False})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.values: list[bytes] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for message in self.consumer.consume(500, 0.5):
                if message.error() is None:
                    self.values.append(message.value())
                else:
                    self.errors.append(str(message.error()))
        self.consumer.close()


def start_copier(client: str, bootstrap: str, log_path: Path, topics: tuple[str, str] | None = None,
                 group: str | None = None, transactional_id: str | None = None) -> subprocess.Popen:
    script, *options = COPIERS[client]
    source, output = topics or (f"in-{client}", f"out-{client}")
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, script, bootstrap, source, output,
                                 "--group", group or f"group-{client}",
                                 "--transactional-id", transactional_id or f"txn-{client}", *options],
                                stdout=log, stderr=subprocess.STDOUT)


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Partition -> the group's committed offset (absent: none yet), {} while the coordinator
    cannot answer. (kafka-python's admin: librdkafka 2.16's list_consumer_group_offsets crashed
    the test process in rd_kafka_handle_OffsetFetch -> rd_kafka_cgrp_op while the coordinator moved.)"""
    try:
        client = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), request_timeout_ms=10000)
    except KafkaPythonError:
        return {}
    try:
        offsets = client.list_group_offsets({group: [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]})
    except KafkaPythonError:
        return {}
    finally:
        client.close()
    return {tp.partition: meta.offset for tp, meta in offsets[group].items() if meta.offset >= 0}


@pytest.mark.parametrize("client", COPIERS)
def test_copier_is_exactly_once_through_bounces_of_leaders_coordinators_and_controller(three, tmp_path, client):
    bootstrap = three.bootstrap
    source_topic, output_topic, group = f"in-{client}", f"out-{client}", f"group-{client}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (source_topic, output_topic):
        admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    topics = {source_topic: PARTITIONS, output_topic: PARTITIONS}
    wait_for(lambda: in_sync(bootstrap, topics), timeout=LIMIT_S, what="the topics fully replicated")
    source = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produced = 0

    def add_input(count: int) -> None:
        nonlocal produced
        for i in range(produced, produced + count):
            source.produce(source_topic, key=b"%d" % i, value=b"%d" % i, partition=i % PARTITIONS)
        assert source.flush(LIMIT_S) == 0
        produced += count

    log_path = tmp_path / "copier.log"
    add_input(CHUNK)
    copier = start_copier(client, bootstrap, log_path)
    reader = Reader(bootstrap, output_topic)
    reader.start()
    topics.update({"__consumer_offsets": INTERNAL, "__transaction_state": INTERNAL})
    outputs = [TopicPartition(output_topic, p) for p in range(PARTITIONS)]
    starts = 1

    def committed() -> int:
        """Input records whose copies are committed, as the group's committed offsets say."""
        return sum(group_offsets(bootstrap, group, source_topic).values())

    def progressed_to(target: int) -> bool:
        nonlocal copier, starts
        if copier.poll() is not None:   # ended on an error it could not abort from: start another
            starts += 1
            assert starts <= 20, f"the copier keeps failing:\n{log_path.read_text()[-3000:]}"
            copier = start_copier(client, bootstrap, log_path)
        return committed() >= target

    def run_bounces() -> None:
        nonlocal copier, starts
        for role, how in BOUNCES:
            # Bounce while the copier is in the middle of a chunk: it has copied some of it.
            add_input(CHUNK)
            wait_for(lambda: progressed_to(produced - CHUNK + CHUNK // 4), timeout=LIMIT_S,
                     what=f"the copier's progress before bouncing the {role}", interval=0.5)
            if role == "copier":
                copier.send_signal(signal.SIGKILL)
                copier.wait()
                copier = start_copier(client, bootstrap, log_path)
                starts += 1
                continue
            victim = _victim(bootstrap, role, client)
            print(f"bouncing the {role} (broker {victim}) with {how}")
            if how == "kill":
                three.brokers[victim].kill()
            else:
                assert three.brokers[victim].stop() == 0
            three.brokers[victim].start()
            wait_for(lambda: in_sync(bootstrap, topics), timeout=LIMIT_S, what=f"the ISRs full after the {role}")
        wait_for(lambda: progressed_to(produced), timeout=LIMIT_S, what="the copy complete", interval=0.5)

    try:
        try:
            run_bounces()
        except AssertionError as exc:
            copier.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(f"{exc}\ncopier log:\n{log_path.read_text()[-8000:]}") from None
        finally:
            copier.send_signal(signal.SIGKILL)
            copier.wait()
        wait_until_stable(bootstrap, outputs)
        output = Counter(value for _, _, _, value in read_all(bootstrap, outputs, "read_committed"))
        expected = Counter(b"copied:%d" % i for i in range(produced))
        missing = sorted(int(v[7:]) for v in expected - output if v.startswith(b"copied:"))
        assert output == expected, f"missing {missing[:10]}, extra {sorted((output - expected).items())[:10]}"
        wait_for(lambda: len(reader.values) >= produced, timeout=LIMIT_S, what="the reader at the end")
    finally:
        reader.done.set()
        reader.join()
    assert Counter(reader.values) == expected   # never an aborted record, nor one twice
    aborted = [v for _, _, _, v in read_all(bootstrap, outputs, "read_uncommitted") if v.startswith(b"aborted:")]
    assert aborted, "the copier aborted no transaction on purpose: the reader had nothing to not see"
    print(f"{produced} records, {starts} copier starts, {len(aborted)} aborted records in the log")


def _victim(bootstrap: str, role: str, client: str) -> int:
    """The broker that now plays `role`."""
    if role == "controller":
        return wait_for(lambda: controller(bootstrap), timeout=LIMIT_S, what="a controller")
    topic, partition = {
        "input": (f"in-{client}", 0), "output": (f"out-{client}", 1),
        "transaction": ("__transaction_state", partition_for(f"txn-{client}", INTERNAL)),
        "group": ("__consumer_offsets", partition_for(f"group-{client}", INTERNAL)),
    }[role]
    return wait_for(lambda: max(leaders(bootstrap, topic).get(partition, (-1, 0))[0], 0), timeout=LIMIT_S,
                    what=f"a leader of {topic}-{partition}")


def _metadata_errors(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Partition -> (leader, error code) as a live broker's Metadata answers."""
    try:
        with AdminProtocolClient(bootstrap, timeout=10) as client:
            [info] = [t for t in client.metadata_response([topic]).topics if t.name == topic]
    except (ProtocolClientError, ValueError):
        return {}
    return {int(p.partition_index): (int(p.leader_id), int(p.error_code)) for p in info.partitions}


def test_copier_with_replication_factor_1_waits_out_a_killed_broker(three, tmp_path):
    """Replication factor 1: each partition has one copy. While the broker holding some is
    killed, Metadata answers them LEADER_NOT_AVAILABLE (retriable) with no leader, and the
    copier goes on copying the other partitions; once the broker is back, its partitions are
    copied too, and the output is the input exactly once: nothing acknowledged was lost,
    nothing read twice, no aborted record read."""
    bootstrap = three.bootstrap
    topics, group, txn_id = ("rf1-in", "rf1-out"), "rf1-group", "rf1-copier"
    brokers = sorted(three.brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Partition p of both topics on the same broker: the one killed takes an input partition
    # and the output partition its records go to, and leaves whole pairs to copy.
    for topic in topics:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                      replica_assignment=[[b] for b in brokers])])[topic].result(60)
    for topic in topics:
        wait_for(lambda: len(led := leaders(bootstrap, topic)) == PARTITIONS and all(l >= 0 for l, _ in led.values()),
                 timeout=LIMIT_S, what=f"{topic} led")
    source = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produced: dict[int, int] = dict.fromkeys(range(PARTITIONS), 0)
    values: list[int] = []

    def add_input(partitions) -> None:
        for p in partitions:
            for _ in range(CHUNK // PARTITIONS):
                source.produce(topics[0], value=b"%d" % len(values), partition=p)
                values.append(len(values))
                produced[p] += 1
        assert source.flush(LIMIT_S) == 0   # acknowledged

    log_path = tmp_path / "copier.log"
    copier = start_copier("kafka-python", bootstrap, log_path, topics, group, txn_id)
    starts = 1
    reader = Reader(bootstrap, topics[1])
    reader.start()

    def copied(partitions) -> bool:
        nonlocal copier, starts
        if copier.poll() is not None:
            starts += 1
            assert starts <= 10, f"the copier keeps failing:\n{log_path.read_text()[-3000:]}"
            copier = start_copier("kafka-python", bootstrap, log_path, topics, group, txn_id)
        offsets = group_offsets(bootstrap, group, topics[0])
        return all(offsets.get(p, 0) >= produced[p] for p in partitions)

    try:
        add_input(range(PARTITIONS))
        wait_for(lambda: copied(range(PARTITIONS)), timeout=LIMIT_S, what="the first chunk copied", interval=0.5)
        controller_id = wait_for(lambda: controller(bootstrap), timeout=LIMIT_S, what="a controller")
        victim = next(b for b in brokers if b != controller_id)   # controller failover is the RF=3 test's
        down = brokers.index(victim)
        live = [p for p in range(PARTITIONS) if p != down]
        three.brokers[victim].kill()
        survivor = three.brokers[controller_id].bootstrap
        for topic in topics:
            found = wait_for(lambda: (lambda m: m if m.get(down, (0, 0))[0] == -1 else None)(
                _metadata_errors(survivor, topic)), timeout=LIMIT_S, what=f"{topic}-{down} without a leader")
            assert found[down][1] == KafkaErrorCode.leader_not_available and for_code(found[down][1]).retriable
            assert all(found[p] == (brokers[p], 0) for p in live), found
        add_input(live)
        wait_for(lambda: copied(live), timeout=LIMIT_S, what="the live partitions copied with a broker down",
                 interval=0.5)
        three.brokers[victim].start()
        add_input(range(PARTITIONS))
        wait_for(lambda: copied(range(PARTITIONS)), timeout=LIMIT_S, what="the copy complete", interval=0.5)
    except AssertionError as exc:
        reader.done.set()
        raise AssertionError(f"{exc}\ncopier log:\n{log_path.read_text()[-8000:]}") from None
    finally:
        copier.send_signal(signal.SIGKILL)
        copier.wait()
    inputs = [TopicPartition(topics[0], p) for p in range(PARTITIONS)]
    outputs = [TopicPartition(topics[1], p) for p in range(PARTITIONS)]
    expected = Counter(b"copied:%d" % i for i in values)
    try:
        wait_until_stable(bootstrap, outputs)
        assert Counter(v for _, _, _, v in read_all(bootstrap, inputs, "read_uncommitted")) == Counter(
            b"%d" % i for i in values)   # every acknowledged input record, once
        output = Counter(value for _, _, _, value in read_all(bootstrap, outputs, "read_committed"))
        assert output == expected, f"missing {sorted(expected - output)[:10]}, extra {sorted((output - expected).items())[:10]}"
        wait_for(lambda: len(reader.values) >= len(values), timeout=LIMIT_S, what="the reader at the end")
    finally:
        reader.done.set()
        reader.join()
    assert Counter(reader.values) == expected   # never an aborted record, nor one twice
    aborted = [v for _, _, _, v in read_all(bootstrap, outputs, "read_uncommitted") if v.startswith(b"aborted:")]
    assert aborted, "the copier aborted no transaction on purpose: the reader had nothing to not see"
    print(f"{len(values)} records, {starts} copier starts, {len(aborted)} aborted records in the log")

