"""Transactions version 2 (KIP-890 part 2) against a real broker process.

No client in the venv speaks it (librdkafka, kafka-python and aiokafka stay on version 1), so
these tests play a Java 4.x producer's requests as raw frames built from the protocol schemas:
ApiVersions (the finalized `transaction.version`), InitProducerId, transactional Produce v12
without AddPartitionsToTxn, TxnOffsetCommit v5 without AddOffsetsToTxn, and EndTxn v5, which
bumps the epoch and answers with it. What they write is read back with confluent-kafka's
read_committed consumer. A late write under the epoch of a transaction that has ended is
refused with INVALID_PRODUCER_EPOCH, as Kafka refuses it.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kio.schema.api_versions.v4.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from tests.raw_txn_v2 import RawProducer
from tests.waiting import wait_for
from tests.wire import roundtrip


def _connect(broker):
    host, _, port = broker.bootstrap.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=60)


def _create(broker, topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


@contextlib.contextmanager
def _producer(broker, topic: str, first: bytes | None = None):
    """A Java-4.x-style producer on its own connection to `broker`, initialized, for the new
    one-partition `topic`; `first`: a value its transaction has already written."""
    _create(broker, topic)
    with _connect(broker) as sock:
        producer = RawProducer(sock, topic)
        producer.init()
        if first is not None:
            assert producer.produce(first)[0] == ErrorCode.none
        yield producer


def _read_committed(broker, topic, expected: int):
    """The values a read_committed consumer sees, once it sees `expected` many (the markers are
    written after EndTxn is answered) and the partition's end has been reached."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values, at_end = [], False
    deadline = time.monotonic() + 60
    while (len(values) < expected or not at_end) and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.2):
            if message.error() is not None:
                if message.error().code() == -191:  # _PARTITION_EOF
                    at_end = True
                    continue
                raise KafkaException(message.error())
            at_end = False
            values.append(message.value())
    consumer.close()
    return values


def _committed_offset(broker, group, topic):
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
    finally:
        consumer.close()


def test_api_versions_finalizes_transaction_version_2(ottla_broker):
    with _connect(ottla_broker) as sock:
        _, response = roundtrip(sock, ApiVersionsRequest(client_software_name="tests",
                                                         client_software_version="1"))
    assert [(f.name, f.min_version_level, f.max_version_level) for f in response.finalized_features] == \
        [("transaction.version", 2, 2)]
    assert response.finalized_features_epoch >= 0   # a client ignores the features at epoch -1
    assert [(f.name, f.min_version, f.max_version) for f in response.supported_features] == \
        [("transaction.version", 0, 2)]
    versions = {k.api_key: k.max_version for k in response.api_keys}
    assert (versions[0], versions[24], versions[26], versions[28]) == (13, 5, 5, 5)


def test_java_4x_sequence_commits_with_an_epoch_bump_and_fences_the_late_write(ottla_broker):
    topic, group = "tv2-commit", "tv2-group"
    with _producer(ottla_broker, topic) as producer:
        first_epoch = producer.epoch
        # No AddPartitionsToTxn: the partition joins the transaction with its first write.
        assert producer.produce(b"one") == (ErrorCode.none, 0)
        assert producer.produce(b"two") == (ErrorCode.none, 1)
        # No AddOffsetsToTxn either.
        assert producer.commit_offsets(group, 42) == ErrorCode.none
        ended = producer.end(commit=True)
        assert (ended.error_code, ended.producer_id, ended.producer_epoch) == \
            (ErrorCode.none, producer.producer_id, first_epoch + 1)
        assert _read_committed(ottla_broker, topic, 2) == [b"one", b"two"]
        assert wait_for(lambda: _committed_offset(ottla_broker, group, topic) == 42, what="the offset commit")

        # A late write of the transaction that ended (its epoch, its next sequence) is refused.
        assert producer.produce(b"zombie", epoch=first_epoch, sequence=2)[0] == ErrorCode.invalid_producer_epoch
        # A retried EndTxn of it gets the outcome that was decided, with the bumped epoch.
        retried = producer.end(commit=True, epoch=first_epoch)
        assert (retried.error_code, retried.producer_epoch) == (ErrorCode.none, first_epoch + 1)

        # The next transaction runs at the bumped epoch, from sequence 0.
        assert producer.produce(b"three")[0] == ErrorCode.none
        assert producer.end(commit=True).producer_epoch == first_epoch + 2
    assert _read_committed(ottla_broker, topic, 3) == [b"one", b"two", b"three"]


def test_abort_bumps_the_epoch_and_hides_the_records(ottla_broker):
    topic = "tv2-abort"
    with _producer(ottla_broker, topic, first=b"aborted") as producer:
        epoch = producer.epoch
        ended = producer.end(commit=False)
        assert (ended.error_code, ended.producer_epoch) == (ErrorCode.none, epoch + 1)
        # An abort with nothing written (the client cannot tell whether its write got through).
        producer.settled()
        assert producer.end(commit=False).producer_epoch == epoch + 2
        assert producer.produce(b"kept")[0] == ErrorCode.none
        assert producer.end(commit=True).error_code == ErrorCode.none
        assert producer.produce(b"zombie", epoch=epoch, sequence=1)[0] == ErrorCode.invalid_producer_epoch
    assert _read_committed(ottla_broker, topic, 1) == [b"kept"]


def test_below_transaction_version_2_the_broker_looks_like_one_without_it(ottla_broker_factory):
    broker = ottla_broker_factory({"transaction.version": 0})
    with _producer(broker, "tv1-only") as producer:
        _, response = roundtrip(producer.sock, ApiVersionsRequest(client_software_name="tests",
                                                         client_software_version="1"))
        assert response.finalized_features == ()
        versions = {k.api_key: k.max_version for k in response.api_keys}
        assert (versions[24], versions[26], versions[28]) == (4, 4, 4)
        # KIP-890 part 1 only: a write to a partition never added is refused, not added.
        assert producer.produce(b"stray")[0] == ErrorCode.invalid_txn_state
    # Given as a config, the level is listed as what the broker was started with, as Kafka lists a
    # property it does not define (without it, not at all: test_admin_compat.py).
    resource = ConfigResource("BROKER", "0")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_configs([resource])[resource].result(30)
    entry = described["transaction.version"]
    assert (entry.value, entry.source, entry.is_read_only) == ("0", ConfigSource.STATIC_BROKER_CONFIG.value, True)


@pytest.mark.parametrize("transaction_version", [0, 2])
def test_librdkafka_transactions_work_at_either_level(ottla_broker_factory, transaction_version):
    """librdkafka stays on version 1 (AddPartitionsToTxn, EndTxn v1-v3) whatever the broker offers."""
    from confluent_kafka import Producer
    broker = ottla_broker_factory({"transaction.version": transaction_version})
    topic = "tv1-client"
    _create(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "librdkafka", "linger.ms": 1})
    producer.init_transactions(30)
    for outcome in ("committed", "aborted", "committed-too"):
        producer.begin_transaction()
        producer.produce(topic, value=outcome.encode(), partition=0)
        if outcome == "aborted":
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    assert _read_committed(broker, topic, 2) == [b"committed", b"committed-too"]


def test_a_new_instance_fences_the_old_one_and_aborts_its_transaction(ottla_broker):
    topic = "tv2-fence"
    _create(ottla_broker, topic)
    with _connect(ottla_broker) as old_sock, _connect(ottla_broker) as new_sock:
        old = RawProducer(old_sock, topic)
        old.init()
        assert old.produce(b"left-open")[0] == ErrorCode.none
        new = RawProducer(new_sock, topic)
        new.init()          # aborts the open transaction (CONCURRENT_TRANSACTIONS until done)
        assert new.epoch > old.epoch + 1
        assert old.produce(b"zombie")[0] == ErrorCode.invalid_producer_epoch
        assert old.end(commit=True).error_code == ErrorCode.producer_fenced
        assert new.produce(b"new")[0] == ErrorCode.none
        assert new.end(commit=True).error_code == ErrorCode.none
    assert _read_committed(ottla_broker, topic, 1) == [b"new"]


def test_a_commit_decided_before_a_crash_is_rolled_forward_with_the_bumped_epoch(ottla_broker_factory):
    """The broker kills itself once the PrepareCommit record is durable, before any marker
    (failpoint `txn.after_prepare_commit`); the restarted coordinator writes the markers under
    the bumped epoch, and a retried EndTxn v5 gets that epoch."""
    broker = ottla_broker_factory(env={"OTTLA_FAILPOINTS": "txn.after_prepare_commit"})
    topic = "tv2-crash"
    with _producer(broker, topic, first=b"decided") as producer:
        epoch = producer.epoch
        try:
            producer.end(commit=True)
        except ConnectionError:
            pass   # the broker may die before its answer gets out
    assert broker.process.wait(60) == -9
    broker.env = {}
    broker.start()
    assert _read_committed(broker, topic, 1) == [b"decided"]
    with _connect(broker) as sock:
        producer.sock = producer.leader = producer.group = sock
        retried = producer.end(commit=True, epoch=epoch)
        assert (retried.error_code, retried.producer_epoch) == (ErrorCode.none, epoch + 1)
        assert producer.produce(b"zombie", epoch=epoch, sequence=1)[0] == ErrorCode.invalid_producer_epoch
