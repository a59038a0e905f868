"""The exactly-once sink's kept transactional producer against a real broker killed (-9) and restarted
between two micro-batches, without Spark: the write task runs in this process as a Python worker would.

When every broker a librdkafka client knows is down at once (always, with one broker), librdkafka
re-bootstraps by default and decommissions the brokers it knew, while its coordinator cache still
points at one of them; send_offsets_to_transaction then waits for that broker forever, past its own
timeout (confluentinc/librdkafka#5511, #5456). The demo's write task sat there for 8-10 minutes.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.spark import sink
from ottla.spark.options import parse_write_options
from tests.spark.task_context import StreamingTaskContext

TIMEOUT_MS = 20_000
# A guard against a hang, not a speed check: librdkafka gives up on every call after TIMEOUT_MS, so a
# write still running after several times that is stuck.
STUCK_S = 6 * TIMEOUT_MS / 1000


def write(monkeypatch, options, batch: int, values: list[bytes]) -> sink.TaskResult:
    """Run one write task in a thread, failing (not hanging) if it is stuck in librdkafka."""
    monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: StreamingTaskContext(batch)))
    outcome: list = []

    def run():
        try:
            outcome.append(sink.StreamWriter(options).write(iter([pa.RecordBatch.from_pydict({"value": values})])))
        except BaseException as error:  # reported below, in the test's thread
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)  # a stuck librdkafka call cannot be interrupted
    thread.start()
    thread.join(STUCK_S)
    assert outcome, f"the write task of batch {batch} is stuck after {STUCK_S:.0f}s (its timeout is {TIMEOUT_MS} ms)"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        values = []
        while (message := consumer.poll(5)) is not None:
            assert message.error() is None, message.error()
            values.append(message.value())
        return values
    finally:
        consumer.close()


@pytest.mark.timeout(300)
def test_a_kept_producer_writes_the_next_batch_after_the_broker_restarted(ottla_broker, monkeypatch):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    for future in admin.create_topics([NewTopic("out", 1, 1)]).values():
        future.result(30)
    options = parse_write_options({"kafka.bootstrap.servers": ottla_broker.bootstrap, "topic": "out",
                                   "timeoutMs": str(TIMEOUT_MS)}, streaming=True)
    monkeypatch.setattr(sink, "_TRANSACTIONAL", {})  # this "worker" keeps no clients yet

    assert write(monkeypatch, options, 4, [b"a", b"b"]).records == 2
    assert len(sink._TRANSACTIONAL) == 1  # kept for the next micro-batch
    ottla_broker.restart(crash=True)
    assert write(monkeypatch, options, 5, [b"c"]).records == 1
    assert write(monkeypatch, options, 5, [b"c"]).already_written  # a replay of batch 5 finds its marker

    assert read_committed(ottla_broker.bootstrap, "out") == [b"a", b"b", b"c"]
    for task in sink._TRANSACTIONAL.values():
        task.close()
