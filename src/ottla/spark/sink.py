"""Writing: an at-least-once batch sink and an exactly-once micro-batch sink.

Exactly-once, per write task of micro-batch B (Spark partition P of query Q):

1. A transactional producer with transactional.id `<prefix><Q>-<P>` calls init_transactions(). Kafka
   bumps the producer epoch, so any earlier attempt of the same task (a zombie: a retried task, a
   stopped query's straggler) is fenced, and its unfinished transaction is aborted or completed.
2. The task reads the committed offset of consumer group `<prefix><Q>-<P>` on partition 0 of the
   marker topic. It is B + 1 if a previous attempt already committed batch B: the task writes nothing.
3. Otherwise it writes its rows and, in the same transaction, commits offset B + 1 for that group
   (send_offsets_to_transaction), then commits. Rows and marker become visible together or not at all.

Spark re-runs a micro-batch with the same id and the same input offsets after a task retry, a
failed batch or a restart from the checkpoint, so every replay finds the marker of each task that
got through. The guarantee needs a deterministic micro-batch: the same rows land in the same Spark
partition on replay (true for Kafka sources and stateless or checkpointed-state transformations).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from .options import OptionError, WriteOptions

_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"


@dataclass
class TaskResult(WriterCommitMessage):
    partition: int
    records: int
    already_written: bool = False


def check_input_schema(schema: StructType, options: WriteOptions) -> None:
    """The columns of Spark's Kafka sink: value (required), key, topic, partition, headers."""
    text = (StringType(), BinaryType())
    header = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
    expected = {"value": (text, "string or binary"), "key": (text, "string or binary"),
                "topic": ((StringType(),), "string"), "partition": ((IntegerType(),), "int"),
                "headers": ((header,), "array<struct<key: string, value: binary>>")}
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise OptionError(f"the DataFrame to write needs a 'value' column; it has {sorted(types)}")
    if "topic" not in types and options.topic is None:
        raise OptionError("set option 'topic' or give the DataFrame a 'topic' column")
    for name, (allowed, description) in expected.items():
        if name in types and not any(_same_type(types[name], t) for t in allowed):
            raise OptionError(f"column {name!r} must be {description}, not {types[name].simpleString()}")


def _same_type(actual, expected) -> bool:
    """Compare types ignoring nullability, which Spark does not require of the sink's columns."""
    return actual.simpleString() == expected.simpleString()


def check_topic_exists(options: WriteOptions) -> None:
    wanted = {t for t in (options.topic, options.marker_topic) if t}
    if not wanted:
        return
    topics = AdminClient(options.client).list_topics(timeout=30).topics
    missing = sorted(t for t in wanted if t not in topics or topics[t].error is not None)
    if missing:
        raise OptionError(f"unknown topic(s) {missing}")


def _records(batches: Iterator, default_topic: str | None) -> Iterator[tuple]:
    """(topic, partition, key, value, headers) per row; option `topic` overrides the column, as in Spark."""
    for batch in batches:
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names
                   if name in ("value", "key", "topic", "partition", "headers")}
        size = batch.num_rows
        nones = [None] * size
        for topic, partition, key, value, headers in zip(
                [default_topic] * size if default_topic else columns["topic"],
                columns.get("partition", nones), columns.get("key", nones), columns["value"],
                columns.get("headers", nones)):
            if topic is None:
                raise ValueError("a row has a null 'topic' and no option 'topic' is set")
            yield topic, partition, key, value, [(h["key"], h["value"]) for h in headers or ()]


def _producer_config(options: WriteOptions, **extra) -> dict:
    # Java clients partition keys with murmur2; match them so keys land where a Java producer puts them.
    return {"partitioner": "murmur2_random", **options.client, **extra}


def _produce_all(producer: Producer, records: Iterator[tuple]) -> tuple[int, list[str]]:
    """Produce every record; returns the count and a list that collects delivery failures as they arrive."""
    failures = []

    def delivered(err, msg):
        if err is not None:
            failures.append(f"{msg.topic()}-{msg.partition()}: {err.str()}")

    count = 0
    for topic, partition, key, value, headers in records:
        while True:
            try:
                producer.produce(topic, value, key, -1 if partition is None else partition,
                                 on_delivery=delivered, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: serve delivery reports until there is room
        producer.poll(0)
        count += 1
    return count, failures


def _write_at_least_once(batches: Iterator, options: WriteOptions) -> TaskResult:
    producer = Producer(_producer_config(options, **{"enable.idempotence": True}))
    count, failures = _produce_all(producer, _records(batches, options.topic))
    remaining = producer.flush(options.timeout_s)
    if failures or remaining:
        raise RuntimeError(f"{len(failures)} record(s) failed, {remaining} unacknowledged; first: "
                           f"{failures[:1]}")
    return TaskResult(TaskContext.get().partitionId(), count)


def _write_exactly_once(batches: Iterator, options: WriteOptions) -> TaskResult:
    context = TaskContext.get()
    partition = context.partitionId()
    batch_id = int(context.getLocalProperty(_BATCH_ID))
    records = _records(batches, options.topic)
    first = next(records, None)
    if first is None:
        return TaskResult(partition, 0)  # nothing to write, nothing to mark: a replay has nothing either
    ident = f"{options.transactional_id_prefix}{context.getLocalProperty(_QUERY_ID)}-{partition}"
    producer = Producer(_producer_config(options, **{"transactional.id": ident}))
    producer.init_transactions(options.timeout_s)
    marker = Consumer({**options.client, "group.id": ident, "enable.auto.commit": False,
                       "isolation.level": "read_committed"})
    try:
        done = marker.committed([TopicPartition(options.marker_topic, 0)], options.timeout_s)[0].offset
        if done > batch_id:
            for _ in batches:  # Spark streams the input to the worker; read it all before returning
                pass
            return TaskResult(partition, 0, already_written=True)
        producer.begin_transaction()
        try:
            count, failures = _produce_all(producer, itertools.chain([first], records))
            producer.flush(options.timeout_s)
            if failures:
                raise RuntimeError(f"{len(failures)} record(s) failed; first: {failures[0]}")
            producer.send_offsets_to_transaction([TopicPartition(options.marker_topic, 0, batch_id + 1)],
                                                 marker.consumer_group_metadata(), options.timeout_s)
            producer.commit_transaction(options.timeout_s)
        except BaseException:
            _abort_quietly(producer, options.timeout_s)
            raise
        return TaskResult(partition, count)
    finally:
        marker.close()


def _abort_quietly(producer: Producer, timeout_s: float) -> None:
    """Abort so the partitions' LSO is not held back; if this fails (e.g. we were fenced), the next
    attempt's init_transactions() aborts the transaction instead."""
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException:
        pass


class BatchWriter(DataSourceArrowWriter):
    """`df.write`: at-least-once, like Spark's Kafka sink; a retried task writes its rows again."""

    def __init__(self, options: WriteOptions):
        self._options = options

    def write(self, iterator: Iterator) -> TaskResult:
        return _write_at_least_once(iterator, self._options)


class StreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream`: exactly-once by default (see the module docstring), or at-least-once."""

    def __init__(self, options: WriteOptions):
        self._options = options

    def write(self, iterator: Iterator) -> TaskResult:
        if self._options.exactly_once:
            return _write_exactly_once(iterator, self._options)
        return _write_at_least_once(iterator, self._options)

    def commit(self, messages: list[TaskResult | None], batchId: int) -> None:
        """Nothing left to do: each task committed its own transaction."""

    def abort(self, messages: list[TaskResult | None], batchId: int) -> None:
        """Nothing to undo: committed tasks stay committed and are skipped when the batch is replayed."""
