"""Reading: batch and micro-batch readers over explicit offset ranges; a Spark task reads one range, or
several small ones (`plan`).

The driver plans ranges from ListOffsets answers; with `read_committed` the "latest" offset Kafka
returns is the last stable offset (LSO), so a range never reaches into an open transaction. An
executor reads its range with an assigned consumer (no group membership, no commits) and stops when
the consumer's position reaches the range end. It never waits to *see* offset `end - 1`: that
offset may be a transaction marker or an aborted record, which a read_committed consumer skips.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import itertools
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from .options import EARLIEST, LATEST, OptionError, ReadOptions, TopicPartitionOffsets

log = logging.getLogger(__name__)

_ROWS_PER_ARROW_BATCH = 4096
# Ranges smaller than this share a task (`plan`). A task costs Spark's Python data source machinery about
# 0.1 s of CPU (a Python worker for its read, another for its write, their Arrow streams) and the sink a
# transaction: more than reading and writing this many 100-byte records.
_OFFSETS_PER_SHARED_TASK = 10_000
_METADATA_TIMEOUT_S = 30.0
_CONSUME_TIMEOUT_S = 0.05
# The reader's default; option kafka.fetch.wait.max.ms overrides it. A range ends at or below the LSO, so the
# reader never waits for new records, but a range that ends at the log end leaves a Fetch parked on the broker
# for fetch.wait.max.ms (librdkafka's 500 ms): the next task of the worker's kept consumer waited for it.
_FETCH_WAIT_MAX_MS = 10
_CONSUMERS: dict[tuple, Consumer] = {}  # kept by a Python worker between tasks, by client config
_FREEZE_AT_LEAST = 10_000  # objects in the collector's oldest generation (freeze_worker_heap)


class DataLossError(RuntimeError):
    """Offsets the query must read are gone (deleted by retention, or the topic was recreated)."""


def source_schema(include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source, in its order."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class ReadTask(InputPartition):
    """The offset ranges one Spark task reads, one after the other."""

    ranges: tuple[OffsetRange, ...]


class Cluster:
    """Driver-side metadata and offset look-ups, with the query's isolation level."""

    def __init__(self, options: ReadOptions):
        self._options = options
        self._admin = AdminClient(options.client)

    def partitions(self) -> list[tuple[str, int]]:
        """The subscribed topic-partitions, sorted; an absent topic or partition is an error."""
        metadata = self._admin.list_topics(timeout=_METADATA_TIMEOUT_S)
        existing = {name: sorted(t.partitions) for name, t in metadata.topics.items() if t.error is None}
        sub = self._options.subscription
        if sub.pattern is not None:
            pattern = re.compile(sub.pattern)
            # Like Kafka's consumers, a pattern never matches the broker's internal topics.
            return sorted((t, p) for t, ps in existing.items()
                          if not t.startswith("__") and pattern.fullmatch(t) for p in ps)
        if sub.assigned:
            missing = [tp for tp in sub.assigned if tp[1] not in existing.get(tp[0], ())]
            if missing:
                raise OptionError(f"option 'assign' names topic-partitions that do not exist: {missing}")
            return list(sub.assigned)
        missing = [t for t in sub.topics if t not in existing]
        if missing:
            raise OptionError(f"option 'subscribe' names unknown topic(s) {missing}")
        return sorted((t, p) for t in sub.topics for p in existing[t])

    def earliest(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self._list_offsets(tps, OffsetSpec.earliest())

    def latest(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """End offsets: the LSO under read_committed, the high watermark under read_uncommitted."""
        return self._list_offsets(tps, OffsetSpec.latest())

    def _list_offsets(self, tps, spec) -> dict[tuple[str, int], int]:
        if not tps:
            return {}
        level = IsolationLevel.READ_COMMITTED if self._options.read_committed else IsolationLevel.READ_UNCOMMITTED
        futures = self._admin.list_offsets({TopicPartition(t, p): spec for t, p in tps}, isolation_level=level,
                                           request_timeout=_METADATA_TIMEOUT_S)
        return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}

    def resolve(self, wanted: TopicPartitionOffsets, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Replace the -2/-1 sentinels of an offsets JSON by real offsets."""
        earliest = self.earliest([tp for tp in tps if wanted[tp] == EARLIEST])
        latest = self.latest([tp for tp in tps if wanted[tp] == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, wanted[tp])) for tp in tps}


def check_offsets_json(offsets: TopicPartitionOffsets, tps: Sequence[tuple[str, int]], name: str) -> None:
    unknown = sorted(set(offsets) - set(tps))
    if unknown:
        raise OptionError(f"option {name!r} names topic-partitions outside the subscription: {unknown}")


def plan(starts: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], options: ReadOptions) -> list[ReadTask]:
    """Cut [start, end) per topic-partition into tasks: `maxRecordsPerPartition` caps a task's offsets,
    `minPartitions` asks for at least that many tasks (splitting the larger ranges more). Without
    `minPartitions`, consecutive ranges (in topic-partition order) share a task while it holds at most
    `_OFFSETS_PER_SHARED_TASK` offsets (and `maxRecordsPerPartition`): a micro-batch of a few records per
    partition is one task, not one per partition. The plan depends only on the offsets and the options,
    so a replayed micro-batch puts the same records in the same task (which the exactly-once sink needs)."""
    ranges = [(tp, starts[tp], ends[tp]) for tp in sorted(ends) if ends[tp] > starts[tp]]
    total = sum(end - start for _, start, end in ranges)
    cut = []
    for (topic, partition), start, end in ranges:
        size = end - start
        pieces = 1
        if options.max_records_per_partition:
            pieces = max(pieces, math.ceil(size / options.max_records_per_partition))
        if options.min_partitions and len(ranges) < options.min_partitions:
            # As Spark's Kafka source: a range's share of minPartitions, rounded half up (ceil made 4 equal
            # ranges and minPartitions 4 into 8 tasks).
            pieces = max(pieces, math.floor(options.min_partitions * size / total + 0.5))
        pieces = min(pieces, size)
        bounds = [start + size * i // pieces for i in range(pieces + 1)]
        cut += [OffsetRange(topic, partition, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    if options.min_partitions:
        return [ReadTask((rng,)) for rng in cut]
    limit = min(_OFFSETS_PER_SHARED_TASK, options.max_records_per_partition or _OFFSETS_PER_SHARED_TASK)
    tasks: list[list[OffsetRange]] = []
    held = limit + 1
    for rng in cut:
        size = rng.end - rng.start
        if held + size > limit:
            tasks.append([])
            held = 0
        tasks[-1].append(rng)
        held += size
    return [ReadTask(tuple(group)) for group in tasks]


def read_range(rng: OffsetRange, options: ReadOptions, schema: StructType) -> Iterator:
    """Yield Arrow record batches of the records of one offset range.

    The range is done when the consumer position reaches `end`. The position moves past control
    markers and, under read_committed, past aborted records; a partition EOF event tells the same
    when the range ends exactly at the end of the log.
    """
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    fetch = _RangeFetch(rng, options)
    try:
        while not fetch.done:
            with _collector_paused():
                records = fetch.records(_ROWS_PER_ARROW_BATCH)
                batch = _arrow_batch(records, rng, options.include_headers, arrow_schema) if records else None
                records = None  # freed while paused: the collector never sees them
            if batch is not None:
                yield batch
    except BaseException:
        _CONSUMERS.pop(_consumer_key(options), None)
        fetch.consumer.close()
        raise
    fetch.consumer.unassign()


@contextlib.contextmanager
def _collector_paused():
    """Keep Python's cyclic garbage collector off while a batch's records are fetched and converted.

    Every fetched record is a Message object the collector tracks, so thousands of them held until
    their Arrow batch is built pushed it into repeated collections of the whole worker heap (PySpark,
    pyarrow, numpy): a quarter of a Spark read task's Python samples (py-spy), 0.4-0.8 us per 100-byte
    record. The records hold no cycles and are freed before the collector is back on, so it has nothing
    of theirs to do."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def freeze_worker_heap() -> None:
    """Called at the start of every task. Spark's worker daemon runs a full `gc.collect()` after every task
    (pyspark/daemon.py), which walks the whole heap of the Python worker: PySpark, pyarrow, numpy, pandas,
    45,000-80,000 objects, 20-50 ms of CPU per task here, more than a task of a few thousand records costs
    the connector. Nearly all of that heap lives as long as the worker (modules, classes, caches, kept
    clients), so whenever it has grown by `_FREEZE_AT_LEAST` objects the collector follows (the first task, and
    those that import more lazily), it moves to the collector's permanent generation (`gc.freeze()`): the
    collections after each task walk only what tasks create. Frozen objects are still freed when their
    last reference goes; only cyclic garbage frozen with them would stay, and there is none just after a
    collection."""
    if len(gc.get_objects(generation=2)) >= _FREEZE_AT_LEAST:
        gc.collect()
        gc.freeze()


class _RangeFetch:
    """The consumer's progress through one range: `records(n)` returns the next n or more records (fewer
    at the end); `done` once the position reached the end, or the range was given up (failOnDataLoss)."""

    def __init__(self, rng: OffsetRange, options: ReadOptions):
        self.rng, self.options = rng, options
        self.consumer = _kept_consumer(options)
        self.consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        self.position = rng.start
        self.done = rng.start >= rng.end
        self._last_progress = time.monotonic()

    def records(self, wanted: int) -> list:
        rng, consumer = self.rng, self.consumer
        out: list = []
        while not self.done and len(out) < wanted:
            before = self.position
            # Ask for no more than the range still holds: consume() returns as soon as it has that many.
            # It has fewer when markers or aborted records fill the range's end: then it returns at the
            # timeout, and the position says the range is done, so the timeout is short.
            messages = consumer.consume(num_messages=min(wanted, rng.end - self.position),
                                        timeout=_CONSUME_TIMEOUT_S)
            # Events (EOF, errors) are rare: look for one without a Python loop. (any(), not a comparison
            # with None: KafkaError's == None leaves an exception set, a SystemError later.)
            records = self._records_and_events(messages) if any(map(Message.error, messages)) else messages
            if records:
                if records[-1].offset() >= rng.end:
                    records = records[:bisect.bisect_left(list(map(Message.offset, records)), rng.end)]
                    self.position = rng.end
                else:
                    self.position = max(self.position, records[-1].offset() + 1)
                out += records
            position = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
            self.position = max(self.position, position)
            if self.position > before:
                self._last_progress = time.monotonic()
            elif self.position < rng.end and time.monotonic() - self._last_progress > self.options.poll_timeout_s:
                message = (f"{rng.topic}-{rng.partition}: stuck at offset {self.position} for "
                           f"{self.options.poll_timeout_s:.0f}s while reading up to offset {rng.end}")
                if self.options.fail_on_data_loss:
                    raise DataLossError(message + "; set failOnDataLoss=false to skip the rest of the range")
                log.warning("%s; skipping the rest of the range", message)
                self.done = True
            self.done = self.done or self.position >= rng.end
        return out

    def _records_and_events(self, messages: list) -> list:
        """The records among `messages`, acting on the events (partition EOF, offsets lost, errors)."""
        records = []
        for msg in messages:
            error = msg.error()
            if error is None:
                records.append(msg)
            elif error.code() == KafkaError._PARTITION_EOF:
                self.position = max(self.position, msg.offset())
            elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                self.position = _skip_lost(self.consumer, self.rng, self.position, self.options, error)
            elif error.fatal() or not error.retriable():
                raise KafkaException(error)
        return records


def _consumer_key(options: ReadOptions) -> tuple:
    return tuple(sorted(options.client.items())), options.read_committed


def _kept_consumer(options: ReadOptions) -> Consumer:
    """One assigned consumer per Python worker and client config, kept between tasks (Spark reuses its
    workers): a task then starts fetching without a new client's bootstrap and metadata round trips."""
    key = _consumer_key(options)
    if key not in _CONSUMERS:
        _CONSUMERS[key] = Consumer({
            "group.id": "ottla-spark-reader",  # required by the client; never joined, nothing is committed
            "fetch.wait.max.ms": _FETCH_WAIT_MAX_MS,
            **options.client,
            "isolation.level": "read_committed" if options.read_committed else "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        })
    return _CONSUMERS[key]


def _skip_lost(consumer, rng: OffsetRange, position: int, options: ReadOptions, error) -> int:
    """Offsets below the log start were deleted: fail, or jump to the log start when allowed."""
    low, _ = consumer.get_watermark_offsets(TopicPartition(rng.topic, rng.partition), timeout=_METADATA_TIMEOUT_S)
    message = (f"{rng.topic}-{rng.partition}: offsets {position}..{min(low, rng.end)} are no longer available "
               f"({error.str()})")
    if options.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them", message)
    if low >= rng.end:
        return rng.end
    consumer.seek(TopicPartition(rng.topic, rng.partition, low))
    return low


def _arrow_batch(records: list, rng: OffsetRange, include_headers: bool, arrow_schema):
    """Columns straight from the fetched records: the accessors mapped over the records (no Python loop
    per record), numpy for the numbers. A range without gaps (no markers, aborted or compacted records)
    has consecutive offsets, which need no accessor call at all."""
    size = len(records)
    stamps = np.fromiter(itertools.chain.from_iterable(map(Message.timestamp, records)), np.int64,
                         count=2 * size).reshape(size, 2)
    # confluent-kafka numbers the types 0 none, 1 create, 2 log-append; Spark uses Java's -1, 0, 1.
    kinds = stamps[:, 0]
    first, last = records[0].offset(), records[-1].offset()
    offsets = (np.arange(first, first + size, dtype=np.int64) if last - first + 1 == size
               else np.fromiter(map(Message.offset, records), np.int64, count=size))
    columns = [
        pa.array(list(map(Message.key, records)), pa.binary()),
        pa.array(list(map(Message.value, records)), pa.binary()),
        pa.repeat(pa.scalar(rng.topic, pa.string()), size),
        pa.repeat(pa.scalar(rng.partition, pa.int32()), size),
        pa.array(offsets),
        pa.array(stamps[:, 1] * 1000, pa.int64(), mask=kinds == 0).cast(arrow_schema.field("timestamp").type),
        pa.array((kinds - 1).astype(np.int32)),
    ]
    if include_headers:
        columns.append(pa.array([[{"key": k, "value": v} for k, v in m.headers() or ()] for m in records],
                                arrow_schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema)


def _read(partition: InputPartition, options: ReadOptions, schema: StructType) -> Iterator:
    freeze_worker_heap()
    # Spark substitutes a single InputPartition(None) when there is nothing to read.
    if not isinstance(partition, ReadTask):
        return iter(())
    return itertools.chain.from_iterable(read_range(rng, options, schema) for rng in partition.ranges)


class BatchReader(DataSourceReader):
    """`spark.read`: from `startingOffsets` (default earliest) to `endingOffsets` (default latest)."""

    def __init__(self, options: ReadOptions, schema: StructType):
        if options.starting == "latest":
            raise OptionError("startingOffsets='latest' is not allowed for a batch read")
        self._options = options
        self._schema = schema

    def partitions(self) -> list[ReadTask]:
        cluster = Cluster(self._options)
        tps = cluster.partitions()
        starts = _initial(cluster, tps, self._options.starting or "earliest", "startingOffsets")
        ends = _initial(cluster, tps, self._options.ending or "latest", "endingOffsets")
        for tp in tps:
            if starts[tp] > ends[tp]:
                raise OptionError(f"{tp[0]}-{tp[1]}: starting offset {starts[tp]} is after ending offset {ends[tp]}")
        return plan(_check_retained(cluster, starts, self._options), ends, self._options)

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition, self._options, self._schema)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: offsets are Spark-Kafka style JSON, {"topic": {"partition": offset}}.

    A micro-batch is planned from the offsets Spark logged, so a replay after a failure reads the
    same ranges. Partitions that appear while the query runs are read from their log start.
    """

    def __init__(self, options: ReadOptions, schema: StructType):
        if options.ending is not None:
            raise OptionError("option 'endingOffsets' applies to batch reads only")
        self._options = options
        self._schema = schema
        self._cluster: Cluster | None = None
        self._target: dict[tuple[str, int], int] | None = None
        self._latest: dict[tuple[str, int], int] | None = None

    @property
    def cluster(self) -> Cluster:
        """Created on first use, in the driver's long-lived source process, never on executors."""
        if self._cluster is None:
            self._cluster = Cluster(self._options)
        return self._cluster

    def initialOffset(self) -> dict:
        tps = self.cluster.partitions()
        return _to_json(_initial(self.cluster, tps, self._options.starting or "latest", "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_offsets_per_trigger:
            return ReadMaxRows(self._options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the end of an availableNow run to what is readable now."""
        self._target = self.cluster.latest(self.cluster.partitions())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _from_json(start)
        latest = self.cluster.latest(self.cluster.partitions())
        self._latest = latest
        for tp in sorted(set(begin) - set(latest)):
            _data_loss(self._options, f"{tp[0]}-{tp[1]} no longer exists")
        if self._target is not None:
            latest = {tp: min(offset, self._target[tp]) for tp, offset in latest.items() if tp in self._target}
        base = {**self.cluster.earliest([tp for tp in latest if tp not in begin]), **begin}
        for tp, offset in latest.items():
            if offset < base[tp]:
                _data_loss(self._options, f"{tp[0]}-{tp[1]}: end offset {offset} is below offset {base[tp]}, "
                                          "which was already read (was the topic recreated?)")
                base[tp] = offset
        if isinstance(limit, ReadMaxRows):
            return _to_json(_admit(base, latest, limit.max_rows))
        return _to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return _to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[ReadTask]:
        begin, finish = _from_json(start), _from_json(end)
        new = [tp for tp in finish if tp not in begin]
        return plan({**self.cluster.earliest(new), **begin}, finish, self._options)

    def read(self, partition: InputPartition) -> Iterator:
        return _read(partition, self._options, self._schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""


def _initial(cluster: Cluster, tps, option, name: str) -> dict[tuple[str, int], int]:
    if option == "earliest":
        return cluster.earliest(tps)
    if option == "latest":
        return cluster.latest(tps)
    check_offsets_json(option, tps, name)
    default = EARLIEST if name == "startingOffsets" else LATEST
    return cluster.resolve({tp: option.get(tp, default) for tp in tps}, tps)


def _check_retained(cluster: Cluster, starts: dict, options: ReadOptions) -> dict:
    earliest = cluster.earliest(list(starts))
    for tp, offset in sorted(starts.items()):
        if offset < earliest[tp]:
            _data_loss(options, f"{tp[0]}-{tp[1]}: offsets {offset}..{earliest[tp]} were deleted")
    return {tp: max(offset, earliest[tp]) for tp, offset in starts.items()}


def _data_loss(options: ReadOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to continue without that data")
    log.warning("%s; continuing (failOnDataLoss=false)", message)


def _admit(base: dict, latest: dict, budget: int) -> dict:
    """Spread `budget` offsets over the partitions in proportion to their backlog (largest remainder
    first), so every trigger makes progress and no partition starves."""
    backlog = {tp: max(latest[tp] - base[tp], 0) for tp in sorted(latest)}
    total = sum(backlog.values())
    if total <= budget:
        return dict(latest)
    shares = {tp: budget * lag // total for tp, lag in backlog.items()}
    by_remainder = sorted(backlog, key=lambda tp: (-(budget * backlog[tp] % total), tp))
    for tp in by_remainder[:budget - sum(shares.values())]:
        shares[tp] += 1
    return {tp: base[tp] + shares[tp] for tp in backlog}


def _to_json(offsets: dict[tuple[str, int], int]) -> dict:
    """Sorted, so equal offsets always serialize to the same JSON (Spark compares the strings)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _from_json(offsets: dict) -> dict[tuple[str, int], int]:
    return {(topic, int(partition)): offset for topic, partitions in offsets.items()
            for partition, offset in partitions.items()}
