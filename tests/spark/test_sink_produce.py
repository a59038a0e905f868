"""The sink's produce loop against a real broker, without Spark: a write task runs in this process as a
Python worker would. librdkafka's local queue is kept tiny here, so produce() refuses rows again and
again (BufferError) and the task must go on from each refused row: every row exactly once, each
column with its own row."""

from __future__ import annotations

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.spark import rdkafka, sink
from ottla.spark.options import parse_write_options

ROWS = 500


class Task:
    def partitionId(self):
        return 0


def read_all(bootstrap: str, topic: str, partitions: int) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got = []
        while (message := consumer.poll(5)) is not None:
            assert message.error() is None, message.error()
            got.append((message.partition(), message.key(), message.value(), message.headers()))
        return got
    finally:
        consumer.close()


def test_a_full_local_queue_loses_and_repeats_no_row(ottla_broker, monkeypatch):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic("out", 3, 1)])["out"].result(30)
    monkeypatch.setattr(sink.TaskContext, "get", staticmethod(lambda: Task()))
    monkeypatch.setattr(rdkafka, "_IDEMPOTENT", {})
    options = parse_write_options({"kafka.bootstrap.servers": ottla_broker.bootstrap, "topic": "out",
                                   "kafka.queue.buffering.max.messages": "7"}, streaming=False)
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.RecordBatch.from_pydict({
        "key": [f"k{i}" if i % 5 else None for i in range(ROWS)],
        "value": [f"v{i}".encode() for i in range(ROWS)],
        "partition": [i % 3 if i % 4 else None for i in range(ROWS)],
        "headers": [[{"key": "row", "value": str(i).encode()}] if i % 2 else None for i in range(ROWS)],
    }, schema=pa.schema([("key", pa.string()), ("value", pa.binary()), ("partition", pa.int32()),
                         ("headers", header_type)]))

    assert sink.BatchWriter(options).write(iter([batch])).records == ROWS

    got = read_all(ottla_broker.bootstrap, "out", 3)
    assert len(got) == ROWS
    by_value = {value: (partition, key, headers) for partition, key, value, headers in got}
    assert sorted(by_value) == sorted(f"v{i}".encode() for i in range(ROWS))  # each row once
    for i in range(ROWS):
        partition, key, headers = by_value[f"v{i}".encode()]
        assert key == (f"k{i}".encode() if i % 5 else None)
        assert headers == ([("row", str(i).encode())] if i % 2 else None)
        if i % 4:
            assert partition == i % 3
