"""Log compaction against a real broker with confluent-kafka and kafka-python: the latest value
of every key survives with its offset, tombstones go after delete.retention.ms, transactions
are cleaned as Kafka cleans them, idempotent retries stay deduplicated, and a kill -9 at each
step of the cleaner's swap leaves a consistent log."""

from __future__ import annotations

from functools import partial
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.log.cleaner.swap import FAILPOINTS
from ottla.records.records import iter_batches
from tests.waiting import wait_for as _wait_for

BROKER = {"log.cleaner.backoff.ms": "100"}
KEYS = 1000


def create(bootstrap: str, topic: str, **config) -> None:
    settings = {"cleanup.policy": "compact", "segment.bytes": str(64 * 1024), "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "4000"}
    settings.update({k.replace("_", "."): str(v) for k, v in config.items()})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=settings)])[topic].result(30)


def produce(bootstrap: str, topic: str, items, **extra) -> dict[bytes, tuple[int, bytes | None]]:
    """Produce (key, value) pairs in order; returns each key's last (offset, value)."""
    latest = {}

    def delivered(error, message):
        assert error is None, error
        latest[message.key()] = (message.offset(), message.value())

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384,
                         "enable.idempotence": True, **extra})
    for key, value in items:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    return latest


def read_all(bootstrap: str, topic: str, isolation: str = "read_uncommitted", start: int = 0, stop_at=None):
    """Every record from `start` to the end (or up to `stop_at` records): [(offset, key, value)]."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, start)])
    out = []
    try:
        while stop_at is None or len(out) < stop_at:
            message = consumer.poll(30)
            assert message is not None, "consumer stalled"
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF
                    break
                raise AssertionError(message.error())
            out.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    return out


def read_all_kafka_python(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out = []
    try:
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=5000).values():
                out += [(r.offset, r.key, r.value) for r in records]
    finally:
        consumer.close()
    return out


def cleaner_checkpoint(data_dir: Path, topic: str) -> int:
    try:
        lines = (data_dir / "cleaner-offset-checkpoint").read_text().splitlines()[2:]
    except FileNotFoundError:
        return -1
    return next((int(line.split()[2]) for line in lines if line.split()[:2] == [topic, "0"]), -1)


def active_base(data_dir: Path, topic: str) -> int:
    return max(int(p.name[:-4]) for p in (data_dir / f"{topic}-0").glob("*.log"))


wait_for = partial(_wait_for, timeout=120.0)


def as_state(records) -> dict[bytes, tuple[int, bytes | None]]:
    state = {}
    for offset, key, value in records:
        state[key] = (offset, value)
    return state


def test_updates_and_tombstones_read_back_as_the_latest_value_per_key(ottla_broker_factory):
    broker = ottla_broker_factory(BROKER)
    topic = "table"
    # The tombstones must outlive the reads below on a loaded machine: with 4 s the resumed
    # consumer once ended with the tombstoned keys' older values, as if a clean had removed
    # the tombstones before it got to them (the first half can reach far past offset 50,000,
    # as the cleaner runs while the updates are produced).
    create(broker.bootstrap, topic, delete_retention_ms=30_000)
    updates = [(b"key-%04d" % (i % KEYS), b"value-%06d" % i) for i in range(100_000)]
    expected = produce(broker.bootstrap, topic, updates)
    # A consumer half way through the log before anything is cleaned.
    first_half = read_all(broker.bootstrap, topic, stop_at=50_000)
    resume_at = first_half[-1][0] + 1
    tombstoned = [b"key-%04d" % i for i in range(100)]
    expected.update(produce(broker.bootstrap, topic, [(key, None) for key in tombstoned]))
    # Fresh keys after the tombstones so they leave the active segment and get cleaned.
    expected.update(produce(broker.bootstrap, topic, [(b"fill-%05d" % i, b"x" * 100) for i in range(3000)]))
    last_tombstone = max(expected[key][0] for key in tombstoned)

    wait_for(lambda: cleaner_checkpoint(broker.data_dir, topic) > last_tombstone, what="a clean past the tombstones")
    records = read_all(broker.bootstrap, topic)
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets))
    assert as_state(records) == expected  # offsets unchanged, tombstones still there
    below_active = [k for o, k, _ in records if o < active_base(broker.data_dir, topic)]
    assert len(below_active) == len(set(below_active))  # one record per key where cleaned
    assert len(records) < 10_000

    # The consumer that was half way through carries on and ends with the same table.
    table = {k: v for _, k, v in first_half}
    for _, key, value in read_all(broker.bootstrap, topic, start=resume_at):
        table[key] = value
    assert table == {k: v for k, (_, v) in expected.items()}

    # After delete.retention.ms the tombstones go, and nothing else does.
    live = {k: v for k, v in expected.items() if v[1] is not None}
    wait_for(lambda: as_state(read_all(broker.bootstrap, topic)) == live, what="tombstones to be removed")
    assert as_state(read_all_kafka_python(broker.bootstrap, topic)) == live
    records = read_all(broker.bootstrap, topic)
    assert [o for o, _, _ in records] == sorted({o for o, _, _ in records})

    # The cleaned log survives a kill -9 and a restart unchanged.
    broker.restart(crash=True)
    assert as_state(read_all(broker.bootstrap, topic)) == live


def _txn_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def test_transactions_on_a_compacted_topic(ottla_broker_factory):
    broker = ottla_broker_factory(BROKER)
    topic = "txn-table"
    create(broker.bootstrap, topic)
    committer = _txn_producer(broker.bootstrap, "committer")
    committer.begin_transaction()
    for i in range(50):
        committer.produce(topic, key=b"c-%02d" % i, value=b"committed", partition=0)
    committer.commit_transaction(30)
    aborter = _txn_producer(broker.bootstrap, "aborter")
    aborter.begin_transaction()
    for i in range(50):
        aborter.produce(topic, key=b"c-%02d" % i, value=b"aborted", partition=0)  # would overwrite if kept
    aborter.flush(30)
    aborter.abort_transaction(30)
    fill = produce(broker.bootstrap, topic, [(b"fill-%05d" % i, b"y" * 100) for i in range(2000)])
    hanging = _txn_producer(broker.bootstrap, "hanging")
    hanging.begin_transaction()
    for i in range(20):
        hanging.produce(topic, key=b"o-%02d" % i, value=b"open", partition=0)
    hanging.flush(30)
    open_start = min(o for o, _, v in read_all(broker.bootstrap, topic) if v == b"open")
    produce(broker.bootstrap, topic, [(b"more-%05d" % i, b"z" * 100) for i in range(2000)])
    above_lso = [r for r in read_all(broker.bootstrap, topic) if r[0] >= open_start]

    wait_for(lambda: cleaner_checkpoint(broker.data_dir, topic) >= open_start, what="a clean up to the LSO")
    committed_view = as_state(read_all(broker.bootstrap, topic, "read_committed"))
    uncommitted = read_all(broker.bootstrap, topic)
    # The aborted records are gone for every reader; the committed ones keep their values.
    assert {k: v for k, (_, v) in committed_view.items() if k.startswith(b"c-")} == \
        {b"c-%02d" % i: b"committed" for i in range(50)}
    assert b"aborted" not in {v for _, _, v in uncommitted}
    assert {k for k in committed_view if k.startswith(b"fill-")} == set(fill)
    # Nothing at or above the LSO was touched; read_committed stops before it.
    assert [r for r in uncommitted if r[0] >= open_start] == above_lso
    assert not [k for k in committed_view if k.startswith(b"o-") or k.startswith(b"more-")]

    hanging.commit_transaction(30)
    committed_view = as_state(read_all(broker.bootstrap, topic, "read_committed"))
    assert {k: v for k, (_, v) in committed_view.items() if k.startswith(b"o-")} == \
        {b"o-%02d" % i: b"open" for i in range(20)}


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_kill_9_at_each_step_of_the_swap(ottla_broker_factory, failpoint):
    broker = ottla_broker_factory({**BROKER, "log.cleaner.enable": "false"})
    topic = "crashy"
    create(broker.bootstrap, topic)
    expected = produce(broker.bootstrap, topic, [(b"key-%03d" % (i % 300), b"value-%05d" % i)
                                                  for i in range(20_000)])
    broker.stop()
    broker.config["log.cleaner.enable"] = "true"
    broker.env = {"OTTLA_FAILPOINTS": failpoint}
    broker.start()  # the cleaner's first pass kills it
    wait_for(lambda: broker.process.poll() is not None, what=f"the broker to die at {failpoint}")
    assert f"failpoint {failpoint}" in broker.read_stderr()
    broker.env = {}
    broker.config["log.cleaner.enable"] = "false"  # look at what recovery left, undisturbed
    broker.start()
    records = read_all(broker.bootstrap, topic)
    assert as_state(records) == expected  # no latest value lost, no offset moved
    names = [p.name for p in (broker.data_dir / f"{topic}-0").iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    # The cleaner finishes the job after the restart.
    broker.config["log.cleaner.enable"] = "true"
    broker.restart(crash=True)
    wait_for(lambda: len(read_all(broker.bootstrap, topic)) < 5000, what="the cleaner to run again")
    assert as_state(read_all(broker.bootstrap, topic)) == expected


def _records_in_log(directory: Path) -> int:
    return sum(len(records) for path in directory.glob("*.log")
               for _, records in iter_batches(path.read_bytes()))


def test_consumer_offsets_stay_proportional_to_live_offsets(ottla_broker_factory):
    commits, partitions = 3000, 10
    broker = ottla_broker_factory({**BROKER, "offsets.topic.num.partitions": "1",
                                   "offsets.topic.segment.bytes": str(64 * 1024)})
    topic = "committed"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "storm",
                         "enable.auto.commit": False})
    try:
        for i in range(commits):
            consumer.commit(offsets=[TopicPartition(topic, p, i + 1) for p in range(partitions)],
                            asynchronous=False)
    finally:
        consumer.close()
    directory = broker.data_dir / "__consumer_offsets-0"
    written = commits * partitions
    wait_for(lambda: sum(p.stat().st_size for p in directory.glob("*.log")) <= 3 * 64 * 1024,
             what="__consumer_offsets to be cleaned")
    broker.stop()
    checkpoint = cleaner_checkpoint(broker.data_dir, "__consumer_offsets")
    logs = sorted(directory.glob("*.log"), key=lambda p: int(p.name[:-4]))
    cleaned = [p for p, following in zip(logs, logs[1:]) if int(following.name[:-4]) <= checkpoint]
    in_cleaned = sum(len(r) for p in cleaned for _, r in iter_batches(p.read_bytes()))
    # The cleaned segments hold one record per live offset (plus the group's own records);
    # what is left is at most a dirty segment under min.cleanable.dirty.ratio and the active one.
    assert cleaned and in_cleaned <= partitions + 10, in_cleaned
    size = sum(p.stat().st_size for p in logs)
    assert size <= 3 * 64 * 1024, size
    assert _records_in_log(directory) < written // 4

    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    from confluent_kafka import ConsumerGroupTopicPartitions

    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("storm")])["storm"].result(30)
    assert {tp.partition: tp.offset for tp in result.topic_partitions} == {p: commits for p in range(partitions)}


def test_idempotent_retry_after_its_batches_were_compacted_is_still_a_duplicate(ottla_broker_factory,
                                                                                raw_connection):
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.static.primitive import i16, i32, i64

    from ottla.records.records import Record, build_batch
    from tests.wire import roundtrip

    broker = ottla_broker_factory(BROKER)
    topic = "dedup"
    create(broker.bootstrap, topic)
    sock = raw_connection(broker.bootstrap)
    _, init = roundtrip(sock, InitProducerIdRequest(transactional_id=None,
                                                    transaction_timeout=datetime.timedelta(seconds=60),
                                                    producer_id=i64(-1), producer_epoch=i16(-1)))
    producer_id = init.producer_id

    def send(sock, sequence: int, value: bytes):
        batch = build_batch([Record(b"shared", value)], producer_id=producer_id, producer_epoch=0,
                            base_sequence=sequence)
        request = ProduceRequest(transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=30),
                                 topic_data=(TopicProduceData(name=topic, partition_data=(
                                     PartitionProduceData(index=i32(0), records=batch),)),))
        result = roundtrip(sock, request)[1].responses[0].partition_responses[0]
        assert result.error_code == ErrorCode.none, result
        return result.base_offset

    offsets = [send(sock, sequence, b"idempotent-%d" % sequence) for sequence in range(3)]
    # Another producer overwrites the key, and enough follows to seal and clean it all.
    expected = produce(broker.bootstrap, topic, [(b"shared", b"later")] +
                       [(b"fill-%05d" % i, b"f" * 100) for i in range(3000)])
    wait_for(lambda: cleaner_checkpoint(broker.data_dir, topic) > offsets[-1], what="the producer's batches cleaned")
    state = as_state(read_all(broker.bootstrap, topic))
    assert state[b"shared"] == expected[b"shared"]
    assert not [o for o in offsets if o in {offset for offset, _ in state.values()}]

    # The retried last batch is answered with its original offset and appends nothing,
    # before and after a kill -9 that also lost the producer state snapshots: the state is
    # then rebuilt from the cleaned log alone, where the emptied batch still speaks for it.
    end = read_all(broker.bootstrap, topic)[-1][0]
    assert send(sock, 2, b"idempotent-2") == offsets[2]
    broker.kill()
    for snapshot in (broker.data_dir / f"{topic}-0").glob("*.snapshot"):
        snapshot.unlink()
    broker.start()
    sock = raw_connection(broker.bootstrap)
    assert send(sock, 2, b"idempotent-2") == offsets[2]
    assert read_all(broker.bootstrap, topic)[-1][0] == end
    assert send(sock, 3, b"idempotent-3") > end  # and the producer carries on in sequence


def test_describe_configs_shows_the_cleaner_settings(ottla_broker_factory):
    from confluent_kafka.admin import ConfigResource, ResourceType

    broker = ottla_broker_factory({"log.cleaner.threads": "2", "log.cleaner.delete.retention.ms": "5000"})
    create(broker.bootstrap, "described", min_compaction_lag_ms=100)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    node = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([node])[node].result(30)
    assert {name: configs[name].value for name in (
        "log.cleaner.enable", "log.cleaner.threads", "log.cleaner.dedupe.buffer.size",
        "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms", "log.cleaner.min.cleanable.ratio",
        "log.cleaner.delete.retention.ms", "log.cleaner.max.compaction.lag.ms",
        "log.cleaner.min.compaction.lag.ms")} == {
        "log.cleaner.enable": "true", "log.cleaner.threads": "2", "log.cleaner.dedupe.buffer.size": "134217728",
        "log.cleaner.io.max.bytes.per.second": "1.7976931348623157e+308", "log.cleaner.backoff.ms": "15000",
        "log.cleaner.min.cleanable.ratio": "0.5", "log.cleaner.delete.retention.ms": "5000",
        "log.cleaner.max.compaction.lag.ms": "9223372036854775807", "log.cleaner.min.compaction.lag.ms": "0"}
    topic = ConfigResource(ResourceType.TOPIC, "described")
    configs = admin.describe_configs([topic])[topic].result(30)
    assert (configs["cleanup.policy"].value, configs["min.compaction.lag.ms"].value,
            configs["max.compaction.lag.ms"].value, configs["delete.retention.ms"].value,
            configs["min.cleanable.dirty.ratio"].value) == ("compact", "100", "9223372036854775807", "4000", "0.01")


def test_transaction_state_stays_proportional_to_live_transactional_ids(ottla_broker_factory):
    broker = ottla_broker_factory({**BROKER, "transaction.state.log.num.partitions": "1",
                                   "transaction.state.log.segment.bytes": "16384"})
    topic = "txn-out"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = _txn_producer(broker.bootstrap, "repeat")
    transactions = 300
    for i in range(transactions):
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=b"%d" % i, partition=0)
        producer.commit_transaction(30)
    directory = broker.data_dir / "__transaction_state-0"
    written = 3 * transactions  # at least Ongoing, PrepareCommit and CompleteCommit each
    wait_for(lambda: _records_in_log(directory) < written // 3, what="__transaction_state to be cleaned")
    broker.stop()
    checkpoint = cleaner_checkpoint(broker.data_dir, "__transaction_state")
    logs = sorted(directory.glob("*.log"), key=lambda p: int(p.name[:-4]))
    cleaned = [p for p, following in zip(logs, logs[1:]) if int(following.name[:-4]) <= checkpoint]
    assert cleaned and sum(len(r) for p in cleaned for _, r in iter_batches(p.read_bytes())) <= 1
    assert _records_in_log(directory) < written // 3

    # The coordinator loads the one live transactional id: the producer is fenced by a new
    # instance, which bumps the epoch the log kept, and commits.
    broker.start()
    successor = _txn_producer(broker.bootstrap, "repeat")
    successor.begin_transaction()
    successor.produce(topic, key=b"k", value=b"after restart", partition=0)
    successor.commit_transaction(30)
    assert read_all(broker.bootstrap, topic, "read_committed")[-1][2] == b"after restart"
