"""Writing: an at-least-once batch sink and an exactly-once micro-batch sink.

At-least-once tasks write through Ottla's own idempotent producer (producer.py: record batches encoded from
the Arrow columns), exactly-once tasks through its transactional variant (transactional.py), unless a client
setting needs librdkafka: then through confluent-kafka, with the same protocol.

Exactly-once, per write task of micro-batch B (Spark partition P of query Q):

1. A transactional producer with transactional.id `<prefix><Q>-<P>` initialises (InitProducerId). Kafka
   bumps the producer epoch, so any earlier attempt of the same task (a zombie: a retried task, a
   stopped query's straggler) is fenced, and its unfinished transaction is aborted or completed.
   The Python worker keeps the producer for the next micro-batches of P (`_checkin`).
2. The task reads the committed offset of consumer group `<prefix><Q>-<P>` on partition 0 of the
   marker topic. It is B + 1 if a previous attempt already committed batch B: the task writes nothing.
   A kept producer that is still the current epoch knows the marker without reading it: its own last
   commit (step 3 finds out whether it is still current).
3. Otherwise it begins a transaction, adds offset B + 1 for that group to it first
   (AddOffsetsToTxn: a kept producer that was fenced meanwhile learns it here, before any row is
   sent, and goes back to step 1 with a new producer), then writes its rows and commits. Rows
   and marker become visible together or not at all.

Spark re-runs a micro-batch with the same id and the same input offsets after a task retry, a
failed batch or a restart from the checkpoint, so every replay finds the marker of each task that
got through. The guarantee needs a deterministic micro-batch: the same rows land in the same Spark
partition on replay (true for Kafka sources and stateless or checkpointed-state transformations).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from kio.schema.errors import ErrorCode
from pyarrow._compute import call_function  # not pyarrow.compute: see record_batches
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from ..admin_client import AdminProtocolClient, ProtocolClientError
from . import producer as own_producer
from .heap import freeze_worker_heap
from .marker import MarkerTask
from .options import OptionError, WriteOptions
from .record_batches import Columns, numbers, valid

# A write task's fresh Python worker imports this module and what it needs: Ottla's own producer, and its
# transactional variant only for an exactly-once task. confluent-kafka (rdkafka.py) is imported only where
# the own producer cannot serve the client settings, its admin client only on the driver and for those settings.

_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"

# Clients a Python worker keeps between tasks, by client config (and transactional id).
_EXISTING: set[tuple] = set()  # (client config, topic) found by check_topic_exists in this process
_OWN: dict[tuple, "own_producer.OwnProducer"] = {}
# Exactly-once tasks (rdkafka.TransactionalTask, transactional.Task) by transactional id and client config.
_TRANSACTIONAL: dict[tuple, MarkerTask] = {}
_CHECK_TIMEOUT_S = 30  # how long the driver looks for the topics before the query fails
_CHECK_BACKOFF_S = 0.1
_KEEP_AT_MOST = 16  # transactional producers per worker: each holds connections (and librdkafka threads)


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
    """Fail a query at its start on an unknown topic. Spark asks for the stream writer again in every
    micro-batch (to plan the write and to commit it), in the same long-lived processes: a topic found
    once is not looked up again (a topic deleted later fails the write tasks instead)."""
    config = tuple(sorted(options.client.items()))
    wanted = {t for t in (options.topic, options.marker_topic) if t and (config, t) not in _EXISTING}
    if not wanted:
        return
    if own_producer.supports(options.client):
        missing = _missing_topics(options, sorted(wanted))
    else:
        from confluent_kafka.admin import AdminClient  # settings only librdkafka speaks (TLS, SASL)

        topics = AdminClient(options.client).list_topics(timeout=_CHECK_TIMEOUT_S).topics
        missing = sorted(t for t in wanted if t not in topics or topics[t].error is not None)
    if missing:
        raise OptionError(f"unknown topic(s) {missing}")
    _EXISTING.update((config, t) for t in wanted)


def _missing_topics(options: WriteOptions, topics: list[str]) -> list[str]:
    """One Metadata request for the wanted topics through the own producer's protocol client, which the
    driver has imported with this module: librdkafka's admin client took 55-60 ms to start and answer
    before every write job (docs/performance.md, branch coldsink). A broker not reachable yet is tried
    again for as long as librdkafka's lookup waited."""
    deadline = time.monotonic() + _CHECK_TIMEOUT_S
    while True:
        with AdminProtocolClient(options.client["bootstrap.servers"], timeout=_CHECK_TIMEOUT_S,
                                 client_id=options.client.get("client.id", "ottla-spark")) as cluster:
            try:
                response = cluster.metadata_response(topics)
                return sorted(t.name for t in response.topics if t.error_code != ErrorCode.none)
            except ProtocolClientError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(_CHECK_BACKOFF_S)


def _rows(batches: Iterator) -> Iterator:
    """The non-empty Arrow batches of a task's input."""
    return (batch for batch in batches if batch.num_rows)


def _write_at_least_once(batches: Iterator, options: WriteOptions) -> TaskResult:
    if own_producer.supports(options.client):
        return _write_own(batches, options)
    from . import rdkafka

    return TaskResult(TaskContext.get().partitionId(), rdkafka.write_at_least_once(_rows(batches), options))


def _write_own(batches: Iterator, options: WriteOptions) -> TaskResult:
    """At-least-once through Ottla's own idempotent producer: Arrow columns to record batches, no Python
    call per row. One producer per worker process and client config, kept while its tasks succeed."""
    key = tuple(sorted(options.client.items()))
    producer = _OWN.pop(key, None) or own_producer.OwnProducer(options.client, options.timeout_s)
    count = 0
    try:
        for batch in _rows(batches):
            _send_batch(producer, batch, options.topic)
            count += batch.num_rows
        producer.flush()
    except BaseException:
        producer.close()  # its sequences may be out of step with the broker's: a new producer id next time
        raise
    _OWN[key] = producer
    return TaskResult(TaskContext.get().partitionId(), count)


def _send_batch(producer: own_producer.OwnProducer, batch, default_topic: str | None) -> None:
    """Hand one Arrow batch's columns to the producer, per topic. Option `topic` overrides the column."""
    names = set(batch.schema.names)
    columns = Columns(batch.column("value"), batch.column("key") if "key" in names else None,
                      batch.column("headers") if "headers" in names else None)
    partitions = None
    if "partition" in names:
        column = batch.column("partition")
        partitions = np.where(valid(column), numbers(column, np.int32), -1).astype(np.int64)
    if default_topic:
        producer.send(default_topic, columns, partitions)
        return
    if batch.column("topic").null_count:
        raise ValueError("a row has a null 'topic' and no option 'topic' is set")
    topics = call_function("dictionary_encode", [batch.column("topic")])
    indices = numbers(topics.indices, np.int32)
    for index, topic in enumerate(topics.dictionary.to_pylist()):
        rows = np.flatnonzero(indices == index)
        if len(rows) == len(indices):
            producer.send(topic, columns, partitions)
        elif len(rows):
            producer.send(topic, columns.take(rows), None if partitions is None else partitions[rows])


def _write_exactly_once(batches: Iterator, options: WriteOptions) -> TaskResult:
    context = TaskContext.get()
    partition = context.partitionId()
    batch_id = int(context.getLocalProperty(_BATCH_ID))
    rows = _rows(batches)
    first = next(rows, None)
    if first is None:
        return TaskResult(partition, 0)  # nothing to write, nothing to mark: a replay has nothing either
    ident = f"{options.transactional_id_prefix}{context.getLocalProperty(_QUERY_ID)}-{partition}"
    if own_producer.supports(options.client):
        from .transactional import Task as kind

        send = _send_batch
    else:
        from .rdkafka import TransactionalTask as kind, produce_batch as send
    task = _checkout(kind, ident, options)
    try:
        if not task.begin(batch_id):
            for _ in batches:  # Spark streams the input to the worker; read it all before returning
                pass
            _checkin(task)
            return TaskResult(partition, 0, already_written=True)
        count = 0
        for batch in itertools.chain([first], rows):
            send(task.producer, batch, options.topic)
            count += batch.num_rows
        task.commit(batch_id)
    except BaseException:
        task.discard()
        raise
    _checkin(task)
    return TaskResult(partition, count)


def _key(ident: str, options: WriteOptions) -> tuple:
    return ident, tuple(sorted(options.client.items()))


def _checkout(kind: type, ident: str, options: WriteOptions):
    """The task this worker kept for the transactional id, else a new one of `kind`."""
    kept = _TRANSACTIONAL.pop(_key(ident, options), None)
    return kept if kept is not None else kind(ident, options)


def _checkin(task) -> None:
    """Keep a task whose last transaction committed (or that began none) for the partition's next batches."""
    task.kept = True
    _TRANSACTIONAL[_key(task.ident, task.options)] = task
    while len(_TRANSACTIONAL) > _KEEP_AT_MOST:  # oldest first: a worker serves many partitions
        _TRANSACTIONAL.pop(next(iter(_TRANSACTIONAL))).close()


class BatchWriter(DataSourceArrowWriter):
    """`df.write`: at-least-once, like Spark's Kafka sink; a retried task writes its rows again."""

    def __init__(self, options: WriteOptions):
        self._options = options

    def write(self, iterator: Iterator) -> TaskResult:
        freeze_worker_heap()
        return _write_at_least_once(iterator, self._options)


class StreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream`: exactly-once by default (see the module docstring), or at-least-once."""

    def __init__(self, options: WriteOptions):
        self._options = options

    def write(self, iterator: Iterator) -> TaskResult:
        freeze_worker_heap()
        if self._options.exactly_once:
            return _write_exactly_once(iterator, self._options)
        return _write_at_least_once(iterator, self._options)

    def commit(self, messages: list[TaskResult | None], batchId: int) -> None:
        """Nothing left to do: each task committed its own transaction."""

    def abort(self, messages: list[TaskResult | None], batchId: int) -> None:
        """Nothing to undo: committed tasks stay committed and are skipped when the batch is replayed."""
