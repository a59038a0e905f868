"""The sink through confluent-kafka (librdkafka), for client settings Ottla's own producer does not speak
(`producer.supports`): TLS, SASL, a partitioner of librdkafka's own, and so on.

A module of its own, imported only by a task that takes this path: a write task's fresh Python worker on the
own producer's path pays nothing for confluent-kafka's import.
"""

from __future__ import annotations

import collections
import itertools
import operator
from typing import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from .marker import MarkerTask
from .options import WriteOptions

__all__ = ["TransactionalTask", "produce_batch", "write_at_least_once"]

_LINGER_MS = 100  # the sink's default; option kafka.linger.ms overrides it
# The sink's default; option kafka.reconnect.backoff.ms overrides it. librdkafka spaces new connections by
# half of it: librdkafka's 100 ms made every new transactional producer wait 50 ms for its first broker.
_RECONNECT_BACKOFF_MS = 10

# The at-least-once tasks' producers a Python worker keeps between tasks, by client config.
_IDEMPOTENT: dict[tuple, tuple[Producer, list[str]]] = {}


def producer_config(options: WriteOptions, failures: list[str], **extra) -> dict:
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


def produce_batch(producer: Producer, batch, default_topic: str | None) -> None:
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
        _IDEMPOTENT[key] = Producer(producer_config(options, failures, **{"enable.idempotence": True})), failures
    return _IDEMPOTENT[key]


def write_at_least_once(batches: Iterator, options: WriteOptions) -> int:
    """Produce every row of the non-empty Arrow `batches` and wait until all are written; the row count."""
    producer, failures = _idempotent_producer(options)
    failures.clear()
    count = 0
    try:
        for batch in batches:
            produce_batch(producer, batch, options.topic)
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
    return count


class TransactionalTask(MarkerTask):
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
                             **producer_config(self.options, self.failures, **{"transactional.id": self.ident})})
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
