"""The exactly-once sink's own transactional producer (spark/transactional.py) against real `ottla serve`
processes, read back by a real consumer (confluent-kafka) at both isolation levels: fencing by a second
producer of the same transactional id, an abort that leaves nothing readable committed, and a coordinator
that moved (NOT_COORDINATOR) between two transactions; and the write task's kept producer, fenced by another
worker's task of its partition, fencing it back.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.admin_client import AdminProtocolClient, BrokerConnection
from ottla.protocol.schemas import api_name
from ottla.spark import sink
from ottla.spark.options import parse_write_options
from ottla.spark.record_batches import Columns
from ottla.spark.transactional import Fenced, Task, TransactionalProducer
from tests.transactional_reads import read_all, wait_until_stable
from tests.waiting import wait_for
from tests.spark.task_context import StreamingTaskContext

TIMEOUT_S = 30  # the producer's, for each request it retries
LIMIT_S = 120  # guards against hangs only


def create(bootstrap: str, topic: str, partitions: int = 2, replicas: int = 1) -> list[TopicPartition]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replicas)])[topic].result(60)
    return [TopicPartition(topic, p) for p in range(partitions)]


def rows(*values: bytes) -> Columns:
    return Columns(pa.array(values, pa.binary()), pa.array([v[:1] for v in values], pa.binary()))


def values(bootstrap: str, partitions: list[TopicPartition], isolation: str) -> list[bytes]:
    wait_until_stable(bootstrap, partitions)
    return sorted(value for *_, value in read_all(bootstrap, partitions, isolation))


def committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    try:
        return consumer.committed([TopicPartition(topic, 0)], 30)[0].offset
    finally:
        consumer.close()


def test_a_second_producer_of_the_id_fences_the_first(ottla_broker):
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out")
    first = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)
    first.begin()
    first.send_offsets("g", "out", 0, 1)
    first.send("out", rows(b"zombie-1", b"zombie-2", b"zombie-3"))
    first.flush()

    second = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)  # aborts first's transaction
    assert second.producer_id == first.producer_id and second.producer_epoch > first.producer_epoch
    with pytest.raises(Fenced):
        first.commit()
    first.begin()
    with pytest.raises(Fenced):  # what a kept producer learns before it sends a row
        first.send_offsets("g", "out", 0, 1)

    second.begin()
    second.send_offsets("g", "out", 0, 1)
    second.send("out", rows(b"retry-1", b"retry-2"))
    second.commit()
    assert values(bootstrap, out, "read_committed") == [b"retry-1", b"retry-2"]
    assert len(values(bootstrap, out, "read_uncommitted")) == 5  # the zombie's rows were written, then aborted
    assert committed(bootstrap, "g", "out") == 1
    assert second.committed("g", "out", 0) == 1
    first.close()
    second.close()


def test_an_abort_leaves_nothing_readable_committed(ottla_broker):
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out")
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)
    producer.begin()
    producer.send_offsets("g", "out", 0, 5)
    producer.send("out", rows(b"aborted-1", b"aborted-2", b"aborted-3"))
    producer.send("out", rows(b"aborted-4"), partitions=np.array([1]))
    producer.abort()
    assert producer.committed("g", "out", 0) == -1

    producer.begin()  # the same producer goes on: its next transaction holds nothing of the aborted one
    producer.send_offsets("g", "out", 0, 6)
    producer.send("out", rows(b"committed-1", b"committed-2"))
    producer.commit()
    assert values(bootstrap, out, "read_committed") == [b"committed-1", b"committed-2"]
    assert len(values(bootstrap, out, "read_uncommitted")) == 6
    assert committed(bootstrap, "g", "out") == 6
    producer.close()


def test_a_transaction_after_the_coordinator_moved_goes_to_the_new_one(ottla_cluster_factory, caplog):
    """Two brokers, one replicated `__transaction_state` partition. The producer initialises with its leader;
    the leadership then moves to the other broker (reassignment to the reversed replica order and a preferred
    election), both staying up, so the old coordinator answers the next AddOffsetsToTxn NOT_COORDINATOR."""
    state = {"transaction.state.log.num.partitions": 1, "transaction.state.log.replication.factor": 2,
             "transaction.state.log.min.isr": 1, "offsets.topic.num.partitions": 1,
             "offsets.topic.replication.factor": 2}
    cluster = ottla_cluster_factory(brokers=2, config=state)
    bootstrap = cluster.bootstrap
    out = create(bootstrap, "out", replicas=2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)

    def transaction_state():
        info = admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"].partitions[0]
        return info if len(info.isrs) == 2 else None

    before = wait_for(transaction_state, timeout=LIMIT_S, what="__transaction_state in sync on both brokers")
    other = next(r for r in before.replicas if r != before.leader)
    with AdminProtocolClient(bootstrap, timeout=TIMEOUT_S) as client:
        client.alter_partition_reassignment("__transaction_state", 0, [other, before.leader], 30_000)
        wait_for(lambda: not client.list_partition_reassignments(30_000), timeout=LIMIT_S, what="reassignment")
    wait_for(lambda: admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("__transaction_state", 0)])
             .result(60) and transaction_state().leader == other, timeout=LIMIT_S, what="the leadership moved")

    with caplog.at_level(logging.INFO, logger="ottla.spark.transactional"):
        producer.begin()
        producer.send_offsets("g", "out", 0, 1)
        producer.send("out", rows(b"a", b"b"))
        producer.commit()
    assert "AddOffsetsToTxn for 't-0': NOT_COORDINATOR; looking up the coordinator again" in caplog.text
    assert values(bootstrap, out, "read_committed") == [b"a", b"b"]
    assert committed(bootstrap, "g", "out") == 1
    producer.close()


def test_a_partition_new_to_the_transaction_while_a_produce_is_in_flight(ottla_broker, caplog):
    """One broker is the coordinator and every partition's leader: AddPartitionsToTxn for a later Arrow batch's
    new partition goes over the connection that carries the earlier batch's Produce, still unanswered. Its
    answer must not be read as AddPartitionsToTxn's (nothing moved: no reason to look the coordinator up)."""
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out", partitions=3)
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)
    with caplog.at_level(logging.INFO, logger="ottla.spark.transactional"):
        producer.begin()
        producer.send_offsets("g", "out", 0, 1)
        for partition in range(3):
            producer.send("out", rows(b"p%d-1" % partition, b"p%d-2" % partition),
                          partitions=np.array([partition] * 2))
        producer.commit()
    assert "looking up the coordinator again" not in caplog.text
    assert values(bootstrap, out, "read_committed") == [b"p0-1", b"p0-2", b"p1-1", b"p1-2", b"p2-1", b"p2-2"]
    producer.close()


def test_offsets_sent_while_a_produce_is_in_flight(ottla_broker, caplog):
    """AddOffsetsToTxn and TxnOffsetCommit after a Produce still unanswered on the same connection (one broker
    is the coordinator and the leader): the Produce's answer must not be read as theirs."""
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out", partitions=1)
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)
    with caplog.at_level(logging.INFO, logger="ottla.spark.transactional"):
        producer.begin()
        producer.send("out", rows(b"a-1", b"a-2"), partitions=np.array([0, 0]))
        producer.send_offsets("g", "out", 0, 7)
        producer.commit()
    assert "looking up the coordinator again" not in caplog.text
    assert values(bootstrap, out, "read_committed") == [b"a-1", b"a-2"]
    assert committed(bootstrap, "g", "out") == 7
    producer.close()


def test_a_new_task_sends_what_the_protocol_requires_and_no_more(ottla_broker, monkeypatch):
    """A write task's first micro-batch with a new producer: one connection (ApiVersions), FindCoordinator and
    InitProducerId, the marker read (FindCoordinator, OffsetFetch), the transaction, and one Metadata for the
    topic's leaders. The coordinator is reached at the address FindCoordinator gives: before, a Metadata
    request for the brokers' addresses came first (two per new producer). The kept task's next micro-batch is
    the transaction alone, once the first one's markers are written. The requests are read where the client
    sends them, each still sent."""
    bootstrap = ottla_broker.bootstrap
    create(bootstrap, "out", partitions=1)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": "out",
                                   "timeoutMs": str(TIMEOUT_S * 1000)}, streaming=True)
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})
    sent = []
    submit = BrokerConnection.submit
    monkeypatch.setattr(BrokerConnection, "submit", lambda self, api_key, version, body: sent.append(
        api_name(api_key)) or submit(self, api_key, version, body))

    def write(batch: int, *values: bytes) -> sink.TaskResult:
        monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: StreamingTaskContext(batch)))
        return sink.StreamWriter(options).write(iter([pa.RecordBatch.from_pydict({"value": list(values)})]))

    assert write(0, b"a").records == 1
    assert sent == ["ApiVersions", "FindCoordinator", "InitProducerId", "FindCoordinator", "OffsetFetch",
                    "AddOffsetsToTxn", "TxnOffsetCommit", "Metadata", "AddPartitionsToTxn", "Produce", "EndTxn"]
    with AdminProtocolClient(bootstrap, timeout=TIMEOUT_S) as client:  # markers written: no CONCURRENT_TRANSACTIONS
        wait_for(lambda: client.describe_transaction("ottla-spark-q1-0")[1].transaction_state == "CompleteCommit",
                 timeout=LIMIT_S, what="the first transaction complete")
    sent.clear()
    assert write(1, b"b").records == 1
    assert sent == ["AddOffsetsToTxn", "TxnOffsetCommit", "AddPartitionsToTxn", "Produce", "EndTxn"]
    for task in sink._TRANSACTIONAL.values():
        task.close()


def test_a_kept_task_fenced_by_another_worker_fences_it_back_before_writing(ottla_broker, monkeypatch):
    """Worker A keeps the task of partition 0 after batch 4; worker B runs batch 5 of partition 0 (fencing A)
    and dies mid-transaction, neither committing nor aborting; the retry of batch 5 lands on A, whose kept
    producer learns from AddOffsetsToTxn that it was fenced, fences B in turn and writes batch 5 once."""
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out", partitions=1)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": "out",
                                   "timeoutMs": str(TIMEOUT_S * 1000)}, streaming=True)
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})  # worker A keeps no clients yet

    def write(batch: int, *values: bytes) -> sink.TaskResult:
        monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: StreamingTaskContext(batch)))
        return sink.StreamWriter(options).write(iter([pa.RecordBatch.from_pydict({"value": list(values)})]))

    assert write(4, b"a").records == 1
    (kept,) = sink._TRANSACTIONAL.values()
    worker_b = Task("ottla-spark-q1-0", options)
    assert worker_b.begin(5)
    worker_b.producer.send("out", rows(b"lost"))
    worker_b.producer.flush()

    assert write(5, b"b").records == 1  # back on A
    assert sink._TRANSACTIONAL["ottla-spark-q1-0", (("bootstrap.servers", bootstrap),)] is kept
    assert kept.producer.producer_epoch > worker_b.producer.producer_epoch
    with pytest.raises(Fenced):
        worker_b.producer.commit()
    assert values(bootstrap, out, "read_committed") == [b"a", b"b"]
    assert committed(bootstrap, "ottla-spark-q1-0", "out") == 6
    assert write(5, b"b").already_written
    worker_b.close()
    kept.close()


def test_one_arrow_batch_over_a_megabyte_for_one_partition(ottla_broker):
    """Rows of one partition over the 1 MB batch size are several record batches; a Produce request carries one
    per partition, so they go in consecutive requests (in one request, the broker took the second alone:
    UNKNOWN_PRODUCER_ID, its sequence not 0)."""
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out", partitions=1)
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, "t-0", TIMEOUT_S)
    producer.begin()
    producer.send_offsets("g", "out", 0, 1)
    sent = [b"%06d" % i + b"x" * 200 for i in range(12_000)]  # 2.5 MB: three record batches
    producer.send("out", rows(*sent))
    producer.commit()
    assert values(bootstrap, out, "read_committed") == sorted(sent)
    producer.close()


def test_a_kept_task_that_found_its_batch_written_is_not_held_by_a_dead_workers_transaction(ottla_broker, monkeypatch):
    """Worker B's task finds batch 0 written (a retry after the task failed past its commit) and keeps its
    producer. Worker C then runs batch 1 of the partition (fencing B) and dies with its transaction open. The
    retry of batch 1 on B must not wait on C's pending marker (OffsetFetch answers UNSTABLE_OFFSET_COMMIT until
    the transaction times out): B knows the marker from its read, learns from AddOffsetsToTxn that it was fenced
    and fences C, which aborts C's transaction."""
    bootstrap = ottla_broker.bootstrap
    out = create(bootstrap, "out", partitions=1)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": "out",
                                   "timeoutMs": str(TIMEOUT_S * 1000)}, streaming=True)

    def write(batch: int, *values: bytes) -> sink.TaskResult:
        monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: StreamingTaskContext(batch)))
        return sink.StreamWriter(options).write(iter([pa.RecordBatch.from_pydict({"value": list(values)})]))

    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})  # worker A
    assert write(0, b"a").records == 1
    worker_a = sink._TRANSACTIONAL
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})  # worker B
    assert write(0, b"a").already_written
    worker_c = Task("ottla-spark-q1-0", options)
    assert worker_c.begin(1)
    worker_c.producer.send("out", rows(b"lost"))
    worker_c.producer.flush()

    assert write(1, b"b").records == 1  # on B
    assert values(bootstrap, out, "read_committed") == [b"a", b"b"]
    assert committed(bootstrap, "ottla-spark-q1-0", "out") == 2
    for task in [*worker_a.values(), *sink._TRANSACTIONAL.values(), worker_c]:
        task.close()
