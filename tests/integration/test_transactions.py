"""Transactional producers (librdkafka via confluent-kafka, kafka-python, aiokafka) against a
real broker process: visibility under read_committed, fencing, the coordinator's timeout,
crash recovery, and offsets committed inside a transaction."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError as KafkaPythonError


def _create(bootstrap, name, partitions=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def _producer(bootstrap, transactional_id, **extra):
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "linger.ms": 1, **extra})


def _values(bootstrap, topic, partitions, isolation, expected, settle_s=1.0, wait_s=30.0):
    """Values readable at `isolation`: waits for `expected` many, then `settle_s` more for extras.

    Markers are written after EndTxn is answered, so committed data shows up a moment later.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values = []
    deadline = time.monotonic() + wait_s
    settled = None
    while time.monotonic() < (settled or deadline):
        for message in consumer.consume(500, 0.2):
            if message.error() is not None:
                raise KafkaException(message.error())
            values.append(message.value())
        if settled is None and len(values) >= expected:
            settled = time.monotonic() + settle_s
    consumer.close()
    return values


def test_commit_is_visible_and_abort_is_not(ottla_broker):
    topic = "txn-basic"
    _create(ottla_broker.bootstrap, topic, 2)
    producer = _producer(ottla_broker.bootstrap, "basic")
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"committed-%d" % i, partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"aborted-%d" % i, partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"last", partition=0)
    producer.commit_transaction(30)

    committed = _values(ottla_broker.bootstrap, topic, 2, "read_committed", expected=11)
    assert sorted(committed) == sorted([b"committed-%d" % i for i in range(10)] + [b"last"])
    everything = _values(ottla_broker.bootstrap, topic, 2, "read_uncommitted", expected=21)
    assert len(everything) == 21


def test_open_transaction_holds_back_read_committed(ottla_broker):
    topic = "txn-lso"
    _create(ottla_broker.bootstrap, topic)
    producer = _producer(ottla_broker.bootstrap, "lso")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"pending")
    producer.flush(30)
    assert _values(ottla_broker.bootstrap, topic, 1, "read_committed", expected=0, settle_s=3) == []
    assert _values(ottla_broker.bootstrap, topic, 1, "read_uncommitted", expected=1) == [b"pending"]
    producer.commit_transaction(30)
    assert _values(ottla_broker.bootstrap, topic, 1, "read_committed", expected=1) == [b"pending"]


def test_offsets_for_times_never_name_an_offset_past_the_last_stable_offset(ottla_broker):
    """ListOffsets by timestamp (and MAX_TIMESTAMP) looks only below what the reader may fetch,
    as Kafka's `lastFetchableOffset`: read_committed, a record of an open transaction is not
    found (-1) until the commit, so a consumer is never positioned inside a transaction that
    may still abort; read_uncommitted finds it. Both client libraries."""
    topic = "txn-times"
    _create(ottla_broker.bootstrap, topic)
    producer = _producer(ottla_broker.bootstrap, "times")
    producer.init_transactions(30)
    producer.begin_transaction()
    base = 1_700_000_000_000
    producer.produce(topic, value=b"pending", timestamp=base)
    producer.flush(30)

    def found(isolation):
        consumer = Consumer({"bootstrap.servers": ottla_broker.bootstrap, "group.id": f"times-{uuid.uuid4()}",
                             "isolation.level": isolation})
        offset = consumer.offsets_for_times([TopicPartition(topic, 0, base)], 10)[0].offset
        consumer.close()
        python_consumer = KafkaConsumer(bootstrap_servers=ottla_broker.bootstrap, isolation_level=isolation)
        by_time = python_consumer.offsets_for_times({KafkaTopicPartition(topic, 0): base})
        python_consumer.close()
        python_offset = by_time[KafkaTopicPartition(topic, 0)]
        return offset, python_offset.offset if python_offset is not None else -1

    assert found("read_committed") == (-1, -1)
    assert found("read_uncommitted") == (0, 0)
    producer.commit_transaction(30)
    assert found("read_committed") == (0, 0)


def test_second_instance_fences_the_first(ottla_broker):
    topic = "txn-fence"
    _create(ottla_broker.bootstrap, topic)
    zombie = _producer(ottla_broker.bootstrap, "fence")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(30)

    successor = _producer(ottla_broker.bootstrap, "fence")
    successor.init_transactions(30)        # aborts the zombie's transaction, then bumps the epoch
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    assert raised.value.args[0].fatal()
    assert _values(ottla_broker.bootstrap, topic, 1, "read_committed", expected=1) == [b"successor"]


def test_coordinator_aborts_a_transaction_past_its_timeout(ottla_broker_factory):
    broker = ottla_broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = "txn-timeout"
    _create(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, "slow", **{"transaction.timeout.ms": 1000})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"too-late")
    producer.flush(30)
    time.sleep(3)
    # The coordinator aborted it under a bumped epoch: the producer is fenced, and the abort
    # marker let the LSO pass its data although the producer never ended the transaction.
    with pytest.raises(KafkaException):
        producer.commit_transaction(30)
    follower = _producer(broker.bootstrap, "other")
    follower.init_transactions(30)
    follower.begin_transaction()
    follower.produce(topic, value=b"after")
    follower.commit_transaction(30)
    assert _values(broker.bootstrap, topic, 1, "read_committed", expected=1) == [b"after"]


def test_open_transaction_survives_a_crash_and_is_completed(ottla_broker_factory):
    broker = ottla_broker_factory()
    topic = "txn-crash"
    _create(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, "crash")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-before-crash")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open-at-crash")
    producer.flush(30)
    broker.restart(crash=True)                  # kill -9
    # A new instance after the restart finds the open transaction in the log and aborts it.
    successor = _producer(broker.bootstrap, "crash")
    successor.init_transactions(60)
    successor.begin_transaction()
    successor.produce(topic, value=b"after-crash")
    successor.commit_transaction(30)
    assert _values(broker.bootstrap, topic, 1, "read_committed", expected=2) == [
        b"committed-before-crash", b"after-crash"]


def test_consume_transform_produce_commits_offsets_with_the_output(ottla_broker):
    bootstrap = ottla_broker.bootstrap
    _create(bootstrap, "etl-in")
    _create(bootstrap, "etl-out")
    source = Producer({"bootstrap.servers": bootstrap})
    for i in range(15):
        source.produce("etl-in", value=b"%d" % i)
    source.flush(30)

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "etl", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.subscribe(["etl-in"])           # a member of a real group: TxnOffsetCommit carries its generation
    producer = _producer(bootstrap, "etl")
    producer.init_transactions(30)

    def process(count, commit):
        producer.begin_transaction()
        taken = 0
        while taken < count:
            for message in consumer.consume(count - taken, 5):
                assert message.error() is None
                producer.produce("etl-out", value=b"x" + message.value())
                taken += 1
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    process(10, commit=True)
    process(5, commit=False)
    consumer.close()

    checker = Consumer({"bootstrap.servers": bootstrap, "group.id": "etl", "enable.auto.commit": False})
    (committed,) = checker.committed([TopicPartition("etl-in", 0)], 30)
    checker.close()
    assert committed.offset == 10                       # the aborted batch's offsets were dropped
    assert _values(bootstrap, "etl-out", 1, "read_committed", expected=10) == [b"x%d" % i for i in range(10)]


def test_kafka_python_transactions(ottla_broker):
    _create(ottla_broker.bootstrap, "kp-txn")
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap, transactional_id="kp")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("kp-txn", b"kept", partition=0)
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("kp-txn", b"dropped", partition=0)
    producer.abort_transaction()
    successor = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap, transactional_id="kp")
    successor.init_transactions()
    producer.begin_transaction()
    producer.send("kp-txn", b"zombie", partition=0)
    with pytest.raises(KafkaPythonError):
        producer.commit_transaction()
    producer.close()  # fenced, but its thread would refresh the stopped broker's metadata for good
    successor.close()
    assert _values(ottla_broker.bootstrap, "kp-txn", 1, "read_committed", expected=1) == [b"kept"]


def test_aiokafka_transactions(ottla_broker):
    _create(ottla_broker.bootstrap, "aio-txn")

    async def produce():
        producer = AIOKafkaProducer(bootstrap_servers=ottla_broker.bootstrap, transactional_id="aio")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait("aio-txn", b"kept", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait("aio-txn", b"dropped", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(produce())
    assert _values(ottla_broker.bootstrap, "aio-txn", 1, "read_committed", expected=1) == [b"kept"]
