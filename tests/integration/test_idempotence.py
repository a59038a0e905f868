"""Issue 3: idempotent producers write every record exactly once per partition, in send order,
across lost responses, cut connections and broker crashes.

Real broker process, real clients (librdkafka through confluent-kafka, kafka-python), faults
from tests/faultproxy.py. Every record's value is `<partition>:<sequence>` with a sequence per
partition, so reading a partition back shows duplicates, gaps and reordering directly.
"""

from __future__ import annotations

import collections
import datetime
import logging
import socket
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i64

from ottla.records.records import Record, build_batch
from tests.faultproxy import PRODUCE, FaultProxy
from tests.wire import roundtrip

# Errors that would mean the broker lost or mangled producer state: with correct dedup and
# recovery an idempotent producer never sees them in these scenarios.
STATE_ERRORS = ("OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID")

# librdkafka settings shared by the faulty runs: small batches so there are many requests to
# lose, five in flight (the most idempotence allows), and patience for every fault.
CONFLUENT_SETTINGS = {
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "retries": 1_000_000,
    "linger.ms": 5,
    "batch.num.messages": 200,
    "message.timeout.ms": 300_000,
    "retry.backoff.ms": 20,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 10,
    "reconnect.backoff.max.ms": 200,
}


# -- helpers -------------------------------------------------------------------------------


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _value(partition: int, sequence: int) -> bytes:
    return b"%d:%08d" % (partition, sequence)


def _read_sequences(bootstrap: str, topic: str, partitions: int, timeout: float = 180) -> dict[int, list[int]]:
    """Every record of every partition from offset 0, as the per-partition sequence numbers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "idempotence-check",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: dict[int, list[int]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"reading back stalled; reached the end of {sorted(at_end)}"
            for message in consumer.consume(10_000, 1.0):
                if message.error():
                    assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                    at_end.add(message.partition())
                    continue
                partition, sequence = message.value().split(b":")
                assert int(partition) == message.partition()
                found[message.partition()].append(int(sequence))
    finally:
        consumer.close()
    return found


def _summary(sequences: list[int], sent: int) -> dict[str, int]:
    counts = collections.Counter(sequences)
    return {
        "records": len(sequences),
        "duplicates": len(sequences) - len(counts),
        "missing": sum(1 for s in range(sent) if s not in counts),
    }


def _assert_exactly_once_in_order(found: dict[int, list[int]], sent: list[int]) -> None:
    for partition, count in enumerate(sent):
        sequences = found[partition]
        assert sequences == list(range(count)), f"partition {partition}: {_summary(sequences, count)}"


def _describe_producers(bootstrap: str, topics: dict[str, list[int]]):
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        request = DescribeProducersRequest(topics=tuple(
            TopicRequest(name=name, partition_indexes=tuple(i32(p) for p in partitions))
            for name, partitions in topics.items()))
        return roundtrip(sock, request)[1]


def _active_producers(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple]:
    response = _describe_producers(bootstrap, {topic: list(range(partitions))})
    result = {}
    for partition in response.topics[0].partitions:
        assert partition.error_code == ErrorCode.none, partition
        result[partition.partition_index] = partition.active_producers
    return result


def _assert_one_producer_throughout(bootstrap: str, topic: str, sent: list[int]) -> None:
    """One producer id and epoch 0 on every partition, its last sequence the last record's: the
    client never had to reset its producer id or bump its epoch, which it does after a
    sequence error or a lost producer state."""
    active = _active_producers(bootstrap, topic, len(sent))
    ids = set()
    for partition, count in enumerate(sent):
        (state,) = active[partition]
        assert (state.producer_epoch, state.last_sequence) == (0, count - 1), (partition, state)
        ids.add(state.producer_id)
    assert len(ids) == 1, ids


def _assert_broker_healthy(broker) -> None:
    """A handler that raises closes the connection, which clients treat like any network fault
    and retry; the broker's log is where such a bug would hide."""
    log = broker.read_stderr()
    assert "Traceback" not in log, log[-5000:]


class _ClientLog(logging.Handler):
    """librdkafka's log lines, to look for sequence errors that it handles without telling
    the application."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def logger(self, name: str) -> logging.Logger:
        logger = logging.getLogger(name)
        logger.addHandler(self)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        return logger


class _ConfluentRun:
    """An idempotent (or not) librdkafka producer sending `<partition>:<sequence>` values
    round-robin, recording every error it reports."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, idempotent: bool, name: str):
        self.topic = topic
        self.sent = [0] * partitions
        self.acked = 0
        self.delivery_errors: collections.Counter[str] = collections.Counter()
        self.client_errors: list[KafkaError] = []
        self.log = _ClientLog()
        self.producer = Producer({
            **CONFLUENT_SETTINGS,
            "bootstrap.servers": bootstrap,
            "enable.idempotence": idempotent,
            "error_cb": self.client_errors.append,
            "logger": self.log.logger(f"rdkafka.{name}"),
            "debug": "eos",  # logs every change of the idempotent producer's state
        })

    def _delivered(self, error, message) -> None:
        if error is None:
            self.acked += 1
        else:
            self.delivery_errors[error.name()] += 1

    def produce(self, count: int) -> None:
        partitions = len(self.sent)
        for i in range(count):
            partition = i % partitions
            value = _value(partition, self.sent[partition])
            while True:
                try:
                    self.producer.produce(self.topic, value=value, partition=partition, on_delivery=self._delivered)
                    break
                except BufferError:
                    self.producer.poll(0.01)
            self.sent[partition] += 1
            if i % 1000 == 0:
                self.producer.poll(0)
        assert self.producer.flush(300) == 0, "records still unacknowledged after 300 s"

    def assert_no_errors(self) -> None:
        """Nothing failed, nothing fatal, no sequence error even in the client's own log, and
        one producer id for the whole run: librdkafka resets its id or bumps its epoch (after
        draining) when the broker's answers do not add up. Connection errors are expected:
        the faults cause them."""
        assert not self.delivery_errors, self.delivery_errors
        assert not [e for e in self.client_errors if e.fatal() or e.name() in STATE_ERRORS], self.client_errors
        assert not [line for line in self.log.lines if any(name in line for name in STATE_ERRORS)]
        assert not [line for line in self.log.lines if "state change" in line and "-> Drain" in line]
        assert sum("Acquired PID" in line for line in self.log.lines) == 1


def _faulty_proxy(broker, seed: int, drop_rate: float) -> FaultProxy:
    """Drop this share of Produce responses after the broker appended the batch (and cut that
    connection), and cut 1 frame in 200 in either direction."""
    host, _, port = broker.bootstrap.rpartition(":")
    proxy = FaultProxy((host, int(port)), seed=seed, rewrite_addresses=True).start()
    proxy.drop_responses(drop_rate, api_key=PRODUCE)
    proxy.cut_randomly(0.005)
    return proxy


def _confluent_through_faults(broker, topic: str, *, idempotent: bool) -> tuple[_ConfluentRun, dict[int, list[int]]]:
    partitions, records = 4, 240_000
    _create_topic(broker.bootstrap, topic, partitions)
    proxy = _faulty_proxy(broker, seed=3, drop_rate=0.05)
    try:
        run = _ConfluentRun(proxy.address, topic, partitions, idempotent=idempotent, name=topic)
        run.produce(records)
    finally:
        proxy.stop()
    assert proxy.errors == []
    assert proxy.stats["dropped_responses"] >= 20, proxy.stats
    assert proxy.stats["random_cuts"] >= 1, proxy.stats
    return run, _read_sequences(broker.bootstrap, topic, partitions)


# -- lost responses and cut connections ----------------------------------------------------


@pytest.mark.timeout(900)
def test_confluent_idempotent_producer_writes_exactly_once_through_faults(ottla_broker):
    run, found = _confluent_through_faults(ottla_broker, "idem-confluent", idempotent=True)
    run.assert_no_errors()
    _assert_exactly_once_in_order(found, run.sent)
    _assert_one_producer_throughout(ottla_broker.bootstrap, "idem-confluent", run.sent)
    _assert_broker_healthy(ottla_broker)


@pytest.mark.timeout(900)
def test_same_faults_duplicate_records_without_idempotence(ottla_broker):
    """The control experiment: the faults above really do make retries write twice, so the
    idempotent run's clean result is the broker's doing."""
    run, found = _confluent_through_faults(ottla_broker, "plain-confluent", idempotent=False)
    assert not run.delivery_errors, run.delivery_errors
    summaries = [_summary(found[p], count) for p, count in enumerate(run.sent)]
    assert all(s["missing"] == 0 for s in summaries), summaries  # still at least once
    assert sum(s["duplicates"] for s in summaries) > 0, summaries
    assert _active_producers(ottla_broker.bootstrap, "plain-confluent", len(run.sent)) == {
        p: () for p in range(len(run.sent))
    }


@pytest.mark.timeout(600)
def test_kafka_python_idempotent_producer_writes_exactly_once_through_faults(ottla_broker):
    topic, partitions, records = "idem-kafka-python", 3, 60_000
    _create_topic(ottla_broker.bootstrap, topic, partitions)
    # kafka-python puts all partitions in one request, so fewer requests: drop more of them.
    proxy = _faulty_proxy(ottla_broker, seed=5, drop_rate=0.1)
    try:
        producer = KafkaProducer(bootstrap_servers=proxy.address, linger_ms=2, batch_size=1024,
                                 retry_backoff_ms=20, reconnect_backoff_ms=10, reconnect_backoff_max_ms=200,
                                 request_timeout_ms=10_000, delivery_timeout_ms=300_000)
        assert producer.config["enable_idempotence"]  # kafka-python 3.x's default
        sent = [0] * partitions
        futures = []
        for i in range(records):
            partition = i % partitions
            futures.append(producer.send(topic, value=_value(partition, sent[partition]), partition=partition))
            sent[partition] += 1
        producer.flush(300)
        producer.close(30)
    finally:
        proxy.stop()
    assert proxy.errors == []
    assert proxy.stats["dropped_responses"] >= 10, proxy.stats
    failures = collections.Counter(repr(f.exception) for f in futures if not f.succeeded())
    assert not failures, failures
    _assert_exactly_once_in_order(_read_sequences(ottla_broker.bootstrap, topic, partitions), sent)
    _assert_one_producer_throughout(ottla_broker.bootstrap, topic, sent)
    _assert_broker_healthy(ottla_broker)


# -- broker crashes ------------------------------------------------------------------------


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


@pytest.mark.timeout(900)
def test_idempotent_producer_survives_kill_9_mid_stream(ottla_broker_factory):
    """Three kill -9s while the producer keeps sending. Before each, the proxy swallows the
    Produce responses (keeping the connection), so the broker dies with batches appended but
    unacknowledged: the restarted broker must rebuild producer state from its snapshots and
    log, recognise those retried batches as duplicates and accept the rest."""
    topic, partitions, records, kills = "idem-crash", 4, 200_000, 3
    # Small segments and frequent recovery-point checkpoints: rolls write producer snapshots,
    # and recovery starts at a recent segment, from its snapshot, replaying what follows.
    broker = ottla_broker_factory({"log.segment.bytes": 512 * 1024, "log.flush.offset.checkpoint.interval.ms": 100})
    _create_topic(broker.bootstrap, topic, partitions)
    host, _, port = broker.bootstrap.rpartition(":")
    proxy = FaultProxy((host, int(port)), seed=11, rewrite_addresses=True).start()
    run = _ConfluentRun(proxy.address, topic, partitions, idempotent=True, name=topic)
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            run.produce(records)
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        for k in range(1, kills + 1):
            _wait_for(lambda: run.acked >= k * records // (kills + 1) or not thread.is_alive(), "acknowledgements")
            swallowed = proxy.stats["dropped_responses"]
            proxy.drop_responses(1.0, api_key=PRODUCE, close=False)
            _wait_for(lambda: proxy.stats["dropped_responses"] >= swallowed + 2 or not thread.is_alive(),
                      "appended, unacknowledged batches")
            broker.kill()
            proxy.clear_faults()
            broker.start()
        thread.join(600)
    finally:
        proxy.stop()
    assert not thread.is_alive()
    assert not failure, failure
    assert run.acked == records
    assert proxy.errors == []
    assert proxy.stats["dropped_responses"] >= 2 * kills, proxy.stats

    run.assert_no_errors()
    _assert_exactly_once_in_order(_read_sequences(broker.bootstrap, topic, partitions), run.sent)
    _assert_one_producer_throughout(broker.bootstrap, topic, run.sent)
    _assert_broker_healthy(broker)


def _init_producer_id(sock: socket.socket) -> int:
    _, response = roundtrip(sock, InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(-1), producer_epoch=i16(-1)))
    assert response.error_code == ErrorCode.none, response
    assert response.producer_epoch == 0
    return response.producer_id


def test_producer_ids_stay_unique_across_restarts_and_crashes(ottla_broker, raw_connection):
    """Ids come from blocks claimed durably before the first id of a block is handed out: a
    crash may waste the rest of a block, never hand an id out twice."""
    ids = []
    for restart in range(10):
        sock = raw_connection(ottla_broker.bootstrap)
        ids += [_init_producer_id(sock) for _ in range(3)]
        if restart % 3 == 2:
            ottla_broker.restart()
        else:
            ottla_broker.restart(crash=True)
    ids.append(_init_producer_id(raw_connection(ottla_broker.bootstrap)))
    assert min(ids) >= 0
    assert len(set(ids)) == len(ids), sorted(ids)


# -- DescribeProducers ---------------------------------------------------------------------


def _produce(sock: socket.socket, topic: str, batch: bytes) -> tuple[ErrorCode, int]:
    request = ProduceRequest(transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=30),
                             topic_data=(TopicProduceData(name=topic, partition_data=(
                                 PartitionProduceData(index=i32(0), records=batch),)),))
    _, response = roundtrip(sock, request)
    result = response.responses[0].partition_responses[0]
    return result.error_code, result.base_offset


def _batch(producer_id: int, first_sequence: int, count: int) -> bytes:
    """Records of partition 0 whose values carry their sequence numbers."""
    records = [Record(None, _value(0, first_sequence + i)) for i in range(count)]
    return build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=first_sequence)


def test_describe_producers_shows_idempotent_producer(ottla_broker, raw_connection):
    topic = "described"
    _create_topic(ottla_broker.bootstrap, topic, 2)
    sock = raw_connection(ottla_broker.bootstrap)
    producer_id = _init_producer_id(sock)
    before = time.time_ns() // 1_000_000
    assert _produce(sock, topic, _batch(producer_id, 0, 3)) == (ErrorCode.none, 0)
    assert _produce(sock, topic, _batch(producer_id, 3, 2)) == (ErrorCode.none, 3)
    after = time.time_ns() // 1_000_000

    active = _active_producers(ottla_broker.bootstrap, topic, 2)
    assert active[1] == ()
    (state,) = active[0]
    assert (state.producer_id, state.producer_epoch, state.last_sequence) == (producer_id, 0, 4)
    assert (state.coordinator_epoch, state.current_txn_start_offset) == (-1, -1)
    assert before <= state.last_timestamp <= after

    # A kill -9 loses nothing: the retried first batch is still a duplicate, answered with
    # its original offset, and the producer continues where it was.
    ottla_broker.restart(crash=True)
    (state,) = _active_producers(ottla_broker.bootstrap, topic, 2)[0]
    assert (state.producer_id, state.producer_epoch, state.last_sequence) == (producer_id, 0, 4)
    sock = raw_connection(ottla_broker.bootstrap)
    assert _produce(sock, topic, _batch(producer_id, 3, 2)) == (ErrorCode.none, 3)
    assert _produce(sock, topic, _batch(producer_id, 0, 3)) == (ErrorCode.none, 0)
    assert _produce(sock, topic, _batch(producer_id, 5, 1)) == (ErrorCode.none, 5)
    (state,) = _active_producers(ottla_broker.bootstrap, topic, 2)[0]
    assert state.last_sequence == 5


def _wait_for_recovery_point(broker, topic: str, offset: int) -> None:
    """Until the broker's recovery-point checkpoint says `topic`-0 is safe up to `offset`:
    crash recovery then starts at the segment holding it, from the snapshot at its base."""
    checkpoint = broker.data_dir / "recovery-point-offset-checkpoint"
    deadline = time.monotonic() + 60
    while f"{topic} 0 {offset}" not in (checkpoint.read_text() if checkpoint.exists() else ""):
        assert time.monotonic() < deadline, "no recovery-point checkpoint written"
        time.sleep(0.05)


def test_retries_of_the_last_five_batches_are_duplicates_across_restarts(ottla_broker_factory, raw_connection):
    """The broker remembers a producer's last five batches per partition -- why clients keep
    at most five requests in flight -- and answers a retry of any of them with its original
    offsets, also after a clean restart (state from the shutdown snapshot) and after kill -9
    (state from the snapshot at the last roll plus replay; with 200-byte segments every batch
    gets a segment of its own). The sixth newest batch is out of the window:
    OUT_OF_ORDER_SEQUENCE_NUMBER, and nothing is written.

    In the client tests above the retried batch is almost always the partition's newest, so
    they do not cover the rest of the window.
    """
    broker = ottla_broker_factory({"log.segment.bytes": 200, "log.flush.offset.checkpoint.interval.ms": 100})
    _create_topic(broker.bootstrap, "window", 1)
    sock = raw_connection(broker.bootstrap)
    producer_id = _init_producer_id(sock)
    batches = [_batch(producer_id, 3 * i, 3) for i in range(6)]
    for i, batch in enumerate(batches):
        assert _produce(sock, "window", batch) == (ErrorCode.none, 3 * i)
    for restart in (None, "clean", "kill -9"):
        if restart == "clean":
            broker.restart()
        elif restart == "kill -9":
            _wait_for_recovery_point(broker, "window", 18)
            broker.restart(crash=True)
        sock = raw_connection(broker.bootstrap)
        for i in reversed(range(1, 6)):
            assert _produce(sock, "window", batches[i]) == (ErrorCode.none, 3 * i), (restart, i)
        assert _produce(sock, "window", batches[0]) == (ErrorCode.out_of_order_sequence_number, -1), restart
    assert _produce(sock, "window", _batch(producer_id, 18, 1)) == (ErrorCode.none, 18)
    assert _read_sequences(broker.bootstrap, "window", 1) == {0: list(range(19))}


def test_describe_producers_errors(ottla_broker):
    _create_topic(ottla_broker.bootstrap, "one-partition", 1)
    response = _describe_producers(ottla_broker.bootstrap, {
        "one-partition": [0, 7],
        "no-such-topic": [0, 1],
        "bad/name": [0],
    })
    errors = {(t.name, p.partition_index): (p.error_code, p.active_producers)
              for t in response.topics for p in t.partitions}
    assert errors == {
        ("one-partition", 0): (ErrorCode.none, ()),
        ("one-partition", 7): (ErrorCode.unknown_topic_or_partition, ()),
        ("no-such-topic", 0): (ErrorCode.unknown_topic_or_partition, ()),
        ("no-such-topic", 1): (ErrorCode.unknown_topic_or_partition, ()),
        ("bad/name", 0): (ErrorCode.invalid_topic_exception, ()),
    }


def test_idle_producers_expire(ottla_broker_factory, raw_connection):
    """producer.id.expiration.ms, checked every producer.id.expiration.check.interval.ms: the
    broker forgets a producer that stopped writing."""
    broker = ottla_broker_factory({"producer.id.expiration.ms": 10_000,
                                   "producer.id.expiration.check.interval.ms": 500})
    _create_topic(broker.bootstrap, "expiring", 1)
    sock = raw_connection(broker.bootstrap)
    producer_id = _init_producer_id(sock)
    assert _produce(sock, "expiring", _batch(producer_id, 0, 1)) == (ErrorCode.none, 0)
    assert [s.producer_id for s in _active_producers(broker.bootstrap, "expiring", 1)[0]] == [producer_id]
    deadline = time.monotonic() + 60
    while _active_producers(broker.bootstrap, "expiring", 1)[0]:
        assert time.monotonic() < deadline, "producer never expired"
        time.sleep(0.2)
