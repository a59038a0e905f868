"""The exactly-once write task's use of Kafka transactions, against a small model of a transactional
broker: fencing by epoch, atomic commit of records and group offsets.

test_spark.py checks the sink end to end with Spark and a real broker; this pins the task's protocol
(fence first, then read the marker, then rows and marker in one transaction) in a second, including
an interleaving Spark cannot be made to produce on demand: a zombie still writing while its retry runs.
"""

from __future__ import annotations

import pytest


import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ottla.spark import rdkafka, sink
from ottla.spark.options import parse_write_options


class Broker:
    """Committed records and group offsets, and the current epoch of each transactional id."""

    def __init__(self):
        self.records: list[bytes] = []
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.epochs: dict[str, int] = {}


class FakeProducer:
    def __init__(self, broker: Broker, config: dict):
        self.broker, self.tid, self.epoch = broker, config["transactional.id"], None
        self.pending_records: list[bytes] = []
        self.pending_offsets: dict = {}

    def list_topics(self, topic, timeout):
        pass

    def init_transactions(self, timeout):
        self.epoch = self.broker.epochs[self.tid] = self.broker.epochs.get(self.tid, 0) + 1

    def _check_epoch(self):
        if self.broker.epochs[self.tid] != self.epoch:
            raise KafkaException(KafkaError(KafkaError._FENCED, fatal=True))

    def begin_transaction(self):
        self.pending_records, self.pending_offsets = [], {}

    def produce(self, topic, value, key=None, partition=-1, on_delivery=None, headers=None):
        self._check_epoch()
        self.pending_records.append(value)

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        return 0

    def send_offsets_to_transaction(self, offsets, group, timeout):
        self._check_epoch()
        self.pending_offsets.update({(group, tp.topic, tp.partition): tp.offset for tp in offsets})

    def commit_transaction(self, timeout):
        self._check_epoch()
        self.broker.records += self.pending_records
        self.broker.offsets.update(self.pending_offsets)

    def abort_transaction(self, timeout):
        self._check_epoch()


class FakeConsumer:
    def __init__(self, broker: Broker, config: dict):
        self.broker, self.group = broker, config["group.id"]

    def committed(self, tps, timeout):
        return [TopicPartition(tp.topic, tp.partition, self.broker.offsets.get((self.group, tp.topic, tp.partition),
                                                                               -1001)) for tp in tps]

    def consumer_group_metadata(self):
        return self.group

    def close(self):
        pass


class FakeTask:
    def __init__(self, batch: int, partition: int = 0, query: str = "q1"):
        self.props = {"streaming.sql.batchId": str(batch), "sql.streaming.queryId": query}
        self.partition = partition

    def partitionId(self):
        return self.partition

    def getLocalProperty(self, key):
        return self.props[key]


@pytest.fixture
def broker(monkeypatch) -> Broker:
    state = Broker()
    monkeypatch.setattr(rdkafka, "Producer", lambda config: FakeProducer(state, config))
    monkeypatch.setattr(rdkafka, "Consumer", lambda config: FakeConsumer(state, config))
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})  # clients a worker keeps between tasks: none yet
    # The librdkafka path (client settings the own producer does not speak); test_transactional.py runs the
    # own transactional producer's path against a real broker.
    monkeypatch.setattr(sink.own_producer, "supports", lambda client: False)
    return state


OPTIONS = parse_write_options({"kafka.bootstrap.servers": "x:9092", "topic": "out"}, streaming=True)


def write(monkeypatch, batch: int, values: list[bytes], partition: int = 0):
    monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: FakeTask(batch, partition)))
    return sink.StreamWriter(OPTIONS).write(iter([pa.RecordBatch.from_pydict({"value": values})]))


def test_a_task_commits_its_rows_with_a_marker_of_its_batch(broker, monkeypatch):
    result = write(monkeypatch, 4, [b"a", b"b"])
    assert (result.records, result.already_written) == (2, False)
    assert broker.records == [b"a", b"b"]
    assert broker.offsets == {("ottla-spark-q1-0", "out", 0): 5}


def test_a_replayed_task_finds_its_marker_and_writes_nothing(broker, monkeypatch):
    write(monkeypatch, 4, [b"a", b"b"])
    assert write(monkeypatch, 4, [b"a", b"b"]).already_written
    assert broker.records == [b"a", b"b"]
    write(monkeypatch, 5, [b"c"])
    assert broker.records == [b"a", b"b", b"c"]


def test_markers_are_per_task_partition(broker, monkeypatch):
    write(monkeypatch, 4, [b"a"], partition=0)
    assert not write(monkeypatch, 4, [b"b"], partition=1).already_written
    assert broker.records == [b"a", b"b"]


def test_a_zombie_is_fenced_by_the_retry(broker, monkeypatch):
    """The first attempt stalls mid-transaction; the retry fences it, then the zombie cannot commit."""
    monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: FakeTask(7)))

    def stalled_input():
        yield pa.RecordBatch.from_pydict({"value": [b"a"]})
        assert not write(monkeypatch, 7, [b"a"]).already_written  # the retry runs while we stall
        yield pa.RecordBatch.from_pydict({"value": [b"b"]})

    with pytest.raises(KafkaException):
        sink.StreamWriter(OPTIONS).write(stalled_input())
    assert broker.records == [b"a"]


def test_an_empty_task_opens_no_transaction(broker, monkeypatch):
    monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: FakeTask(3)))
    assert sink.StreamWriter(OPTIONS).write(iter([])).records == 0
    assert broker.epochs == {} and broker.offsets == {}


def test_a_kept_producer_serves_the_next_batches_of_its_partition(broker, monkeypatch):
    """Spark reuses its Python workers: the producer is set up (init_transactions) once, not per batch."""
    for batch, value in enumerate([b"a", b"b", b"c"], start=4):
        assert write(monkeypatch, batch, [value]).records == 1
    assert broker.epochs == {"ottla-spark-q1-0": 1}
    assert broker.records == [b"a", b"b", b"c"]
    assert broker.offsets == {("ottla-spark-q1-0", "out", 0): 7}


def test_a_kept_producer_knows_its_marker_without_reading_it(broker, monkeypatch):
    """Only a fenced producer can have missed a commit of its partition, and AddOffsetsToTxn tells it."""
    reads = []
    monkeypatch.setattr(FakeConsumer, "committed", lambda self, tps, timeout: reads.append(tps) or [
        TopicPartition(tp.topic, tp.partition, broker.offsets.get((self.group, tp.topic, tp.partition), -1001))
        for tp in tps])
    write(monkeypatch, 4, [b"a"])
    assert len(reads) == 1  # a new producer reads the marker
    assert write(monkeypatch, 5, [b"b"]).records == 1
    assert write(monkeypatch, 5, [b"b"]).already_written  # a replay on the same worker
    assert write(monkeypatch, 6, [b"c"]).records == 1
    assert len(reads) == 1
    assert broker.records == [b"a", b"b", b"c"]
    assert broker.offsets == {("ottla-spark-q1-0", "out", 0): 7}


def test_a_kept_producer_fenced_by_another_worker_fences_it_back_before_writing(broker, monkeypatch):
    """Worker A keeps the producer of partition 0; worker B runs batch 5 of partition 0 (fencing A) and
    dies mid-transaction; the retry lands on A, whose kept producer must not be trusted."""
    write(monkeypatch, 4, [b"a"])
    kept = dict(sink._TRANSACTIONAL)
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})

    def dies_mid_transaction():
        yield pa.RecordBatch.from_pydict({"value": [b"lost"]})
        raise SystemExit("worker B dies")

    with pytest.raises(SystemExit):
        write_input = sink.StreamWriter(OPTIONS).write
        monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: FakeTask(5)))
        write_input(dies_mid_transaction())
    monkeypatch.setattr(sink, "_TRANSACTIONAL", kept)  # back on worker A
    assert write(monkeypatch, 5, [b"b"]).records == 1
    assert broker.records == [b"a", b"b"]
    assert broker.offsets == {("ottla-spark-q1-0", "out", 0): 6}
    assert broker.epochs == {"ottla-spark-q1-0": 3}
