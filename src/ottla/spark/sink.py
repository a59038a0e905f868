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

import collections
import itertools
import operator
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from . import producer as own_producer
from . import transactional
from .marker import MarkerTask
from .options import OptionError, WriteOptions
from .record_batches import Columns, numbers, valid
from .source import freeze_worker_heap

_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"

_LINGER_MS = 100  # the sink's default; option kafka.linger.ms overrides it
# The sink's default; option kafka.reconnect.backoff.ms overrides it. librdkafka spaces new connections by
# half of it: librdkafka's 100 ms made every new transactional producer wait 50 ms for its first broker.
_RECONNECT_BACKOFF_MS = 10

# Clients a Python worker keeps between tasks, by client config (and transactional id).
_EXISTING: set[tuple] = set()  # (client config, topic) found by check_topic_exists in this process
_IDEMPOTENT: dict[tuple, tuple[Producer, list[str]]] = {}
_OWN: dict[tuple, "own_producer.OwnProducer"] = {}
# Exactly-once tasks (`_TransactionalTask`, transactional.Task) by transactional id and client config.
_TRANSACTIONAL: dict[tuple, MarkerTask] = {}
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
    topics = AdminClient(options.client).list_topics(timeout=30).topics
    missing = sorted(t for t in wanted if t not in topics or topics[t].error is not None)
    if missing:
        raise OptionError(f"unknown topic(s) {missing}")
    _EXISTING.update((config, t) for t in wanted)


def _producer_config(options: WriteOptions, failures: list[str], **extra) -> dict:
    """Java clients partition keys with murmur2; match them so keys land where a Java producer puts them.
    A task hands its rows over as fast as it can and flushes at the end (flush sends at once, whatever
    the linger), so a long `linger.ms` costs no latency and makes batches of thousands of records: the
    broker's cost is per request as much as per record. Only failed deliveries are reported, to one
    callback per producer: no Python call per delivered row."""

    def delivered(err, msg):
        failures.append(f"{msg.topic()}-{msg.partition()}: {err.str()}")

    return {"partitioner": "murmur2_random", "linger.ms": _LINGER_MS, "reconnect.backoff.ms": _RECONNECT_BACKOFF_MS,
            **options.client, **extra,
            "delivery.report.only.error": True, "on_delivery": delivered}


def _rows(batches: Iterator) -> Iterator:
    """The non-empty Arrow batches of a task's input."""
    return (batch for batch in batches if batch.num_rows)


def _produce_batch(producer: Producer, batch, default_topic: str | None) -> None:
    """Produce the rows of one Arrow batch, column by column: one produce() call per row and nothing else.
    Option `topic` overrides the column, as in Spark. Arguments go by position (a keyword argument costs
    produce() a dict per call, which was a third of its time for 100-byte values): topic, value, key,
    partition, and for headers also produce()'s callback, on_delivery and timestamp as their defaults."""
    names = set(batch.schema.names)
    if default_topic:
        topics = default_topic
    else:
        if batch.column("topic").null_count:
            raise ValueError("a row has a null 'topic' and no option 'topic' is set")
        topics = batch.column("topic").to_pylist()
    columns = [topics, _bytes(batch.column("value")), _bytes(batch.column("key")) if "key" in names else None]
    if "partition" in names:
        columns.append([-1 if p is None else p for p in batch.column("partition").to_pylist()])
    elif "headers" in names:
        columns.append(-1)
    if "headers" in names:
        columns += [None, None, 0, [[(h["key"], h["value"]) for h in row] if row else None
                                    for row in batch.column("headers").to_pylist()]]
    _produce_columns(producer, columns, batch.num_rows)


def _bytes(column) -> list:
    """The column as Python bytes. A string column is viewed as binary first (the same bytes): no str per
    row to decode from UTF-8 and encode again in produce()."""
    if pa.types.is_string(column.type):
        column = column.view(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.view(pa.large_binary())
    return column.to_pylist()


def _produce_columns(producer: Producer, columns: list, size: int) -> None:
    """produce() row by row from columns (lists, or one value for every row): map() hands the arguments
    straight to the call, with no Python loop and no tuple per row. When librdkafka's local queue is full,
    produce() raises BufferError: let deliveries complete and go on with the refused row."""
    produce = producer.produce
    done = 0
    while True:
        args = [(iter(c[done:]) if done else iter(c)) if isinstance(c, list) else itertools.repeat(c, size - done)
                for c in columns]
        try:
            collections.deque(map(produce, *args), maxlen=0)
            return
        except BufferError:
            # map() took the refused row's arguments: it is the one before what the value column has left.
            done = size - operator.length_hint(args[1]) - 1
            producer.poll(0.1)


def _idempotent_producer(options: WriteOptions) -> tuple[Producer, list[str]]:
    """One per worker process and client config, reused by its at-least-once tasks: a task flushes it
    before it returns, so the next task starts from an empty queue."""
    key = tuple(sorted(options.client.items()))
    if key not in _IDEMPOTENT:
        failures: list[str] = []
        _IDEMPOTENT[key] = Producer(_producer_config(options, failures, **{"enable.idempotence": True})), failures
    return _IDEMPOTENT[key]


def _write_at_least_once(batches: Iterator, options: WriteOptions) -> TaskResult:
    if own_producer.supports(options.client):
        return _write_own(batches, options)
    producer, failures = _idempotent_producer(options)
    failures.clear()
    count = 0
    try:
        for batch in _rows(batches):
            _produce_batch(producer, batch, options.topic)
            count += batch.num_rows
        remaining = producer.flush(options.timeout_s)
        if failures or remaining:
            raise RuntimeError(f"{len(failures)} record(s) failed, {remaining} unacknowledged; first: "
                               f"{failures[:1]}")
    except BaseException:
        # A failed task's producer is not reused: what it still holds must not go out with the next task.
        del _IDEMPOTENT[tuple(sorted(options.client.items()))]
        producer.purge()
        raise
    return TaskResult(TaskContext.get().partitionId(), count)


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
    topics = batch.column("topic").dictionary_encode()
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
    own = own_producer.supports(options.client)
    task = _checkout(transactional.Task if own else _TransactionalTask, ident, options)
    try:
        if not task.begin(batch_id):
            for _ in batches:  # Spark streams the input to the worker; read it all before returning
                pass
            _checkin(task)
            return TaskResult(partition, 0, already_written=True)
        count = 0
        send = _send_batch if own else _produce_batch
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


class _TransactionalTask(MarkerTask):
    """The exactly-once write task's confluent-kafka producer and marker consumer: send_offsets_to_transaction
    (AddOffsetsToTxn) tells a kept one that it was fenced (marker.py has the protocol)."""

    fenced = KafkaException

    def __init__(self, ident: str, options: WriteOptions):
        super().__init__(ident, options)
        self.failures: list[str] = []
        self.marker = Consumer({**options.client, "group.id": ident, "enable.auto.commit": False,
                                "isolation.level": "read_committed"})
        self.producer = self._fence()

    def _fence(self) -> Producer:
        # librdkafka's default re-bootstrap, when every broker it knows is down at once (always, with one
        # broker), drops those brokers while its coordinator cache keeps one: send_offsets_to_transaction
        # then waits for it past its timeout (librdkafka #5511, #5456). Option kafka.metadata.recovery.strategy
        # overrides this.
        producer = Producer({"metadata.recovery.strategy": "none",
                             **_producer_config(self.options, self.failures, **{"transactional.id": self.ident})})
        # Connected before init_transactions: librdkafka sends FindCoordinator on the bootstrap connection,
        # loses it when the first Metadata answer replaces that connection by the broker's own, and asks
        # again only on a 500 ms timer (half of the new producers waited so). The second Metadata request
        # goes over the broker's own connection, which FindCoordinator then finds up.
        for _ in range(2):
            producer.list_topics(self.options.marker_topic, timeout=self.options.timeout_s)
        producer.init_transactions(self.options.timeout_s)  # fences every earlier producer of this id
        return producer

    def _read_marker(self) -> int:
        marker = TopicPartition(self.options.marker_topic, 0)
        return self.marker.committed([marker], self.options.timeout_s)[0].offset

    def _open(self, offset: int) -> None:
        self.failures.clear()
        self.producer.begin_transaction()
        self.producer.send_offsets_to_transaction([TopicPartition(self.options.marker_topic, 0, offset)],
                                                  self.marker.consumer_group_metadata(), self.options.timeout_s)

    def _fence_again(self) -> None:
        _abort_quietly(self.producer, self.options.timeout_s)
        self.producer = self._fence()

    def _commit(self) -> None:
        self.producer.flush(self.options.timeout_s)
        if self.failures:
            raise RuntimeError(f"{len(self.failures)} record(s) failed; first: {self.failures[0]}")
        self.producer.commit_transaction(self.options.timeout_s)

    def close(self) -> None:
        self.marker.close()

    def discard(self) -> None:
        """After a failure: abort so the partitions' LSO is not held back, and never reuse this producer."""
        _abort_quietly(self.producer, self.options.timeout_s)
        self.marker.close()


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
