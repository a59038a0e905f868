"""Transactions end to end, the way applications use them: several topics and partitions per
transaction, concurrent transactional producers on one partition, an exactly-once copier
killed -9 (and its broker killed -9) while it runs, a coordinator that dies between
PrepareCommit and the markers, and a producer process that dies inside a transaction.

Every check reads with real consumers after the log has settled (LSO == high watermark on
every partition), so a missing marker shows up as a wait that never ends, not a race."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.admin_client import AdminProtocolClient
from tests.transactional_reads import end_offsets, read_all, wait_until_stable
from tests.waiting import wait_for

COPIER = Path(__file__).with_name("copier.py")
COMMIT_EVERY = 500       # the copier's records per transaction: 200 transactions to interrupt


def _create(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, count, 1) for name, count in topics.items()]).values():
        future.result(15)


def _partitions(topics: dict[str, int]) -> list[TopicPartition]:
    return [TopicPartition(name, p) for name, count in topics.items() for p in range(count)]


def _transactional(bootstrap: str, transactional_id: str, **extra) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, **extra})
    producer.init_transactions(30)
    return producer


def test_transactions_over_several_topics_and_partitions(ottla_broker):
    bootstrap = ottla_broker.bootstrap
    topics = {"orders": 3, "payments": 2, "audit": 1}
    partitions = _partitions(topics)
    _create(bootstrap, topics)
    producer = _transactional(bootstrap, "multi")
    committed, aborted = set(), set()
    for txn in range(12):
        outcome = committed if txn % 3 != 1 else aborted
        producer.begin_transaction()
        for i, tp in enumerate(partitions * 5):
            value = b"txn%d-%s-%d-%d" % (txn, tp.topic.encode(), tp.partition, i)
            producer.produce(tp.topic, value=value, partition=tp.partition)
            outcome.add((tp.topic, tp.partition, value))
        if outcome is committed:
            producer.commit_transaction(30)
        else:
            producer.flush(30)     # the aborted records are really in the log
            producer.abort_transaction(30)

    wait_until_stable(bootstrap, partitions)
    seen_committed = read_all(bootstrap, partitions, "read_committed")
    seen_everything = read_all(bootstrap, partitions, "read_uncommitted")
    assert Counter((t, p, v) for t, p, _, v in seen_committed) == Counter(committed)
    assert Counter((t, p, v) for t, p, _, v in seen_everything) == Counter(committed | aborted)


def test_concurrent_transactions_interleaved_on_one_partition(ottla_broker):
    bootstrap = ottla_broker.bootstrap
    topic, producers, transactions, per_txn = "interleaved", 4, 25, 200
    _create(bootstrap, {topic: 1})
    outcomes: dict[bytes, bool] = {}          # transaction tag -> committed?
    failures: list[BaseException] = []
    start = threading.Barrier(producers)

    def run(index: int) -> None:
        try:
            producer = _transactional(bootstrap, f"interleaved-{index}")
            rng = random.Random(index)
            start.wait()
            for txn in range(transactions):
                tag = b"p%d-t%d" % (index, txn)
                producer.begin_transaction()
                for i in range(per_txn):
                    producer.produce(topic, value=b"%s-%d" % (tag, i), partition=0)
                    if i % 20 == 19:
                        producer.flush(60)     # a batch of its own, so others' batches land in between
                commit = rng.random() < 0.6
                outcomes[tag] = commit
                if commit:
                    producer.commit_transaction(60)
                else:
                    producer.flush(60)
                    producer.abort_transaction(60)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures

    partitions = [TopicPartition(topic, 0)]
    wait_until_stable(bootstrap, partitions)
    everything = read_all(bootstrap, partitions, "read_uncommitted")
    committed = read_all(bootstrap, partitions, "read_committed")
    assert len(everything) == producers * transactions * per_txn

    def tag(value: bytes) -> bytes:
        return value.rpartition(b"-")[0]

    # The test means something only if transactions really overlapped in the log.
    spans: dict[bytes, list[int]] = {}
    for _, _, offset, value in everything:
        spans.setdefault(tag(value), []).append(offset)
    overlapping = sum(1 for offsets in spans.values() if offsets[-1] - offsets[0] + 1 > per_txn)
    assert overlapping >= transactions, f"only {overlapping} transactions interleaved with others"

    # read_committed = read_uncommitted minus the aborted transactions: same records, same offsets.
    assert committed == [r for r in everything if outcomes[tag(r[3])]]
    assert {tag(r[3]) for r in committed} == {t for t, ok in outcomes.items() if ok}


def _start_copier(bootstrap: str, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, str(COPIER), bootstrap, "copy-in", "copy-out",
                                 "--group", "copier", "--transactional-id", "copier",
                                 "--commit-every", str(COMMIT_EVERY)],
                                stdout=log, stderr=subprocess.STDOUT)


def test_copier_is_exactly_once_through_kills_of_itself_and_the_broker(ottla_broker_factory, tmp_path):
    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 0})
    bootstrap = broker.bootstrap
    records, in_partitions = 100_000, 4
    _create(bootstrap, {"copy-in": in_partitions, "copy-out": in_partitions})
    source = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(records):
        while True:
            try:
                source.produce("copy-in", key=b"%d" % i, value=b"%d" % i)
                break
            except BufferError:
                source.poll(0.1)
    assert source.flush(60) == 0
    inputs = _partitions({"copy-in": in_partitions})
    outputs = _partitions({"copy-out": in_partitions})
    # Survives the broker's restart; see copier.py for why librdkafka must not re-bootstrap.
    admin = AdminClient({"bootstrap.servers": bootstrap, "metadata.recovery.strategy": "none"})
    input_ends = end_offsets(admin, inputs, IsolationLevel.READ_UNCOMMITTED)
    assert sum(input_ends.values()) == records

    seed = int(os.environ.get("OTTLA_TEST_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    # Each kill comes once the running copier has written that many more output records
    # (committed or not), so it lands while records are being copied; the amounts add up to
    # well under the input, so every kill happens before the copy is done.
    victims = ["copier"] * 4
    victims.insert(rng.randrange(1, 4), "broker")
    kills = [(victim, rng.randrange(2_000, 8_000)) for victim in victims]
    print(f"seed {seed}, kills {kills}")
    log_path = tmp_path / "copier.log"
    copier = _start_copier(bootstrap, log_path)
    restarts, unexpected_exits, last_kill_at = 1, 0, 0
    deadline = time.monotonic() + 600

    def copied() -> int:
        try:
            return sum(end_offsets(admin, outputs, IsolationLevel.READ_UNCOMMITTED).values())
        except KafkaException:
            return 0

    def committed_offsets() -> dict | None:
        request = [ConsumerGroupTopicPartitions("copier", inputs)]
        try:
            result = admin.list_consumer_group_offsets(request, request_timeout=10)["copier"].result(60)
        except KafkaException:
            return None
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}

    try:
        while committed_offsets() != input_ends:
            assert time.monotonic() < deadline, f"copier stuck (seed {seed}):\n{log_path.read_text()[-3000:]}"
            if copier.poll() is not None:
                # Fatal error (e.g. fenced while the broker restarted): the copier exits, we restart it.
                unexpected_exits += 1
                assert unexpected_exits <= 10, f"copier keeps failing:\n{log_path.read_text()[-3000:]}"
                copier = _start_copier(bootstrap, log_path)
                restarts += 1
            written = copied()
            if kills and written >= last_kill_at + kills[0][1]:
                victim, _ = kills.pop(0)
                last_kill_at = written
                time.sleep(rng.uniform(0, 0.02))
                if victim == "copier":
                    copier.send_signal(signal.SIGKILL)
                    copier.wait()
                    copier = _start_copier(bootstrap, log_path)
                    restarts += 1
                else:
                    broker.kill()
                    broker.start()
            time.sleep(0.05)
    finally:
        copier.send_signal(signal.SIGKILL)
        copier.wait()
    assert not kills, f"the copy was done before these kills: {kills}"

    wait_until_stable(bootstrap, outputs)
    output = read_all(bootstrap, outputs, "read_committed")
    counts = Counter(value for _, _, _, value in output)
    duplicates = [value for value, count in counts.items() if count > 1]
    missing = [i for i in range(records) if b"copied:%d" % i not in counts]
    assert not duplicates and not missing, (
        f"seed {seed}: {len(duplicates)} duplicated (e.g. {duplicates[:5]}), {len(missing)} missing (e.g. {missing[:5]})")
    assert len(output) == records
    assert committed_offsets() == input_ends
    written = len(read_all(bootstrap, outputs, "read_uncommitted"))
    print(f"seed {seed}: {restarts} copier starts ({unexpected_exits} after an exit of its own), "
          f"{written - records} output records aborted")


def _producer_states(bootstrap: str, partitions: list[TopicPartition]) -> dict:
    """Per partition, the open transactions' first offsets (DescribeProducers)."""
    with AdminProtocolClient(bootstrap) as client:
        states = {}
        for tp in partitions:
            producers = client.describe_producers(tp.topic, [tp.partition])[tp.partition]
            states[(tp.topic, tp.partition)] = [p.current_txn_start_offset for p in producers
                                                if p.current_txn_start_offset >= 0]
        return states


def test_coordinator_killed_between_prepare_commit_and_markers(ottla_broker_factory):
    broker = ottla_broker_factory(env={"OTTLA_FAILPOINTS": "txn.after_prepare_commit"})
    bootstrap = broker.bootstrap
    topics = {"fp-a": 2, "fp-b": 2}
    partitions = _partitions(topics)
    _create(bootstrap, topics)
    producer = _transactional(bootstrap, "failpoint", **{"message.timeout.ms": 10000})
    producer.begin_transaction()
    expected = set()
    for i, tp in enumerate(partitions * 10):
        value = b"fp-%d" % i
        producer.produce(tp.topic, value=value, partition=tp.partition)
        expected.add((tp.topic, tp.partition, value))
    producer.flush(30)
    try:
        producer.commit_transaction(5)
    except KafkaException:
        # The PrepareCommit record is durable, then the broker kills itself before any marker;
        # whether the EndTxn answer got out first is a race, so either outcome is right here.
        pass
    assert broker.process.wait(30) == -signal.SIGKILL

    broker.env = {}
    broker.start()
    # Nobody asks: loading __transaction_state finds PrepareCommit and rolls it forward. The
    # markers come first (the LSO moves), the CompleteCommit record after them.
    wait_until_stable(bootstrap, partitions)

    def transaction_state():
        with AdminProtocolClient(bootstrap) as client:
            return client.describe_transaction("failpoint")[1].transaction_state

    wait_for(lambda: transaction_state() == "CompleteCommit", timeout=30, what="the roll-forward's CompleteCommit")
    assert _producer_states(bootstrap, partitions) == {(tp.topic, tp.partition): [] for tp in partitions}
    seen = read_all(bootstrap, partitions, "read_committed")
    assert Counter((t, p, v) for t, p, _, v in seen) == Counter(expected)


_DOOMED_PRODUCER = """
import sys, time
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "doomed",
                     "transaction.timeout.ms": 5000})
producer.init_transactions(30)
producer.begin_transaction()
for i in range(100):
    producer.produce(sys.argv[2], value=b"doomed-%d" % i, partition=i % 2)
producer.flush(30)
print("sent", flush=True)
time.sleep(3600)
"""


def test_producer_killed_inside_a_transaction_is_aborted_on_timeout(ottla_broker_factory):
    broker = ottla_broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    bootstrap = broker.bootstrap
    topic = "doomed"
    partitions = _partitions({topic: 2})
    _create(bootstrap, {topic: 2})
    doomed = subprocess.Popen([sys.executable, "-c", _DOOMED_PRODUCER, bootstrap, topic],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert doomed.stdout.readline().strip() == "sent"
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()

    # Another producer commits after the dead one's records; read_committed cannot pass the
    # open transaction until the coordinator aborts it, then must deliver these and only these.
    follower = _transactional(bootstrap, "follower")
    follower.begin_transaction()
    for i in range(10):
        follower.produce(topic, value=b"after-%d" % i, partition=i % 2)
    follower.commit_transaction(30)

    wait_until_stable(bootstrap, partitions)
    seen = read_all(bootstrap, partitions, "read_committed")
    assert sorted(v for _, _, _, v in seen) == sorted(b"after-%d" % i for i in range(10))
    assert len(read_all(bootstrap, partitions, "read_uncommitted")) == 110
    with AdminProtocolClient(bootstrap) as client:
        _, state = client.describe_transaction("doomed")
    assert state.transaction_state == "CompleteAbort"
