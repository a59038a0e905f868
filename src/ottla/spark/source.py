"""Reading: batch and micro-batch readers over explicit offset ranges; a Spark task reads one range, or
several small ones (`plan`).

The driver plans ranges from ListOffsets answers; with `read_committed` the "latest" offset Kafka
returns is the last stable offset (LSO), so a range never reaches into an open transaction. An
executor reads its range with Fetch requests of its own (`fetch.py`), decoded column-wise
(`columns.py`), and stops when its position reaches the range end. It never waits to *see* offset
`end - 1`: that offset may be a transaction marker or an aborted record, which a read_committed
reader skips.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from ..end_offsets import list_offsets
from .heap import freeze_worker_heap
from .options import (EARLIEST, FETCH_OFFSET_NUM_RETRIES, FETCH_OFFSET_RETRY_INTERVAL_MS, LATEST, DataLossError,
                      OptionError, ReadOptions, TopicPartitionOffsets)

log = logging.getLogger(__name__)

# Ranges smaller than this share a task (`plan`). A task costs Spark's Python data source machinery about
# 0.1 s of CPU (a Python worker for its read, another for its write, their Arrow streams) and the sink a
# transaction: more than reading and writing this many 100-byte records.
_OFFSETS_PER_SHARED_TASK = 10_000
_METADATA_TIMEOUT_S = 30.0


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
        # Retried while a new leader's HW is behind its epoch start (KIP-207), never planned from it.
        answers = list_offsets(self._admin, {TopicPartition(t, p): spec for t, p in tps}, isolation_level=level,
                               timeout_s=_METADATA_TIMEOUT_S)
        return {(tp.topic, tp.partition): info.offset for tp, info in answers.items()}

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
    """Yield Arrow record batches of the records of one offset range, one per Fetch answer."""
    # Imported here, on the executors: the Fetch client's imports (kio's schemas) cost 0.2-0.5 s of CPU,
    # which the driver's Python processes (planning, the streaming source, commits) would pay for nothing.
    from .fetch import read_columns

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    headers_type = arrow_schema.field("headers").type if options.include_headers else None
    timestamp_type = arrow_schema.field("timestamp").type
    topic = pa.scalar(rng.topic, pa.string())
    partition = pa.scalar(rng.partition, pa.int32())
    for fetched in read_columns(rng.topic, rng.partition, rng.start, rng.end, options, headers_type):
        size = len(fetched)
        columns = [
            fetched.keys,
            fetched.values,
            pa.repeat(topic, size),
            pa.repeat(partition, size),
            pa.array(fetched.offsets),
            pa.array(fetched.timestamps * 1000).cast(timestamp_type),
            pa.array(fetched.log_append_time.astype(np.int32)),  # Spark's timestampType: 0 create, 1 log-append
        ]
        if headers_type is not None:
            columns.append(fetched.headers)
        yield pa.RecordBatch.from_arrays(columns, schema=arrow_schema)


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
        if options.fetch_offset_num_retries is not None or options.fetch_offset_retry_interval_ms is not None:
            raise OptionError("options 'fetchOffset.numRetries' and 'fetchOffset.retryIntervalMs' apply to "
                              "streaming reads only")
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
        latest = self._latest_not_below(begin)
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

    def _latest_not_below(self, known: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """End offsets, read again (`fetchOffset.numRetries` times, `fetchOffset.retryIntervalMs` apart, as
        Spark's Kafka source does) while one is below the offset the query has already reached: an answer
        that went back for a moment (a deposed leader still answering, a broker without KIP-207 whose new
        leader's HW has not caught up) is not data loss. One still below after the retries is (`latestOffset`)."""
        retries = self._options.fetch_offset_num_retries
        retries = FETCH_OFFSET_NUM_RETRIES if retries is None else retries
        interval_ms = self._options.fetch_offset_retry_interval_ms
        interval_ms = FETCH_OFFSET_RETRY_INTERVAL_MS if interval_ms is None else interval_ms
        tps = self.cluster.partitions()
        latest = self.cluster.latest(tps)
        for retry in range(1, retries + 1):
            behind = {tp: (known[tp], offset) for tp, offset in latest.items() if offset < known.get(tp, offset)}
            if not behind:
                break
            log.warning("ListOffsets latest went back below offsets already read (partition: (read, latest)) %s; "
                        "reading again in %d ms (retry %d of %d, fetchOffset.numRetries)",
                        {f"{t}-{p}": pair for (t, p), pair in sorted(behind.items())}, interval_ms, retry, retries)
            time.sleep(interval_ms / 1000)
            latest = self.cluster.latest(tps)
        return latest

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
