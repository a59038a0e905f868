"""Rows/s of each leg of an Ottla Spark pipeline against Spark's own `range -> noop` in the same run, and
the fixed cost Ottla adds to a micro-batch against Spark's `rate -> noop` (issue 16).

    .venv/bin/python benchmarks/spark_pipeline.py                    # 400,000 x 100 B and 100,000 x 1 KiB
    .venv/bin/python benchmarks/spark_pipeline.py --rows 100000 --rows-1k 20000 --sizes 100
    .venv/bin/python benchmarks/spark_pipeline.py --sizes 100 --rounds 3 --batches 0 \\
        --conf spark.sql.execution.arrow.maxRecordsPerBatch=4096    # the legs only, a Spark setting tried

One broker (`ottla serve`), one SparkSession on local[2,3] (two cores, task retries); a warm-up round at a
small size starts the JVM's code paths and the Python workers first. Per value size, on the same rows
(key = the row number, value = the row number padded to the size, so every value is distinct):

- `range -> noop`: Spark's baseline, `spark.range(N)` with those columns into the `noop` sink;
- `range -> ottla sink (batch)`: `df.write.format("ottla")` (at-least-once) into the input topic;
- `ottla source -> noop`: `spark.read.format("ottla")` (read_committed) of that topic into `noop`;
- `rate-micro-batch -> ottla sink (streaming, exactly-once)`: one availableNow micro-batch of N rows;
- `ottla -> transform -> ottla (exactly-once)`: the input topic, a value rewritten, into a fresh topic in
  one availableNow micro-batch; the output is then read back and checked: N distinct values;
- after each, its ceiling: the same leg with a null Python data source (`ceiling_source`) in Ottla's place,
  whose reader yields prebuilt Arrow batches of the same rows and whose writers discard theirs. It is what
  any connector whose Spark workers are Python can at best reach: PySpark's Python data source exchange
  (Python workers, Arrow to and from the JVM) with no Kafka in it.

Rounds (`--rounds`) run in one session. Round 1 is cold: Ottla's first large tasks, on Python workers that
have not run them (Spark keeps several workers and hands tasks to them in turn, so the warm-up's small tasks
leave most of them without Ottla's imports). In round 1 each ceiling runs before its Ottla leg, so that the
JVM's compilation (JIT) of PySpark's Arrow exchange paths, which the first large run of each path pays, falls
on the null source (Spark's cost; round 1's ceilings are the worse for it); later rounds alternate the order.
Each round prints its table; with two rounds or more a last table sets round 1 (cold) beside the median of
the later rounds (warm).

Batch legs are timed around the action, streaming legs by Spark's `triggerExecution`. Each leg's CPU seconds
(the Spark JVM with every process under it, and the broker) are taken around the whole action, the streaming
legs' query start and stop included; the share by CPU is `range -> noop`'s CPU over the leg's, which a loaded
machine disturbs less than the wall clock. The fixed cost per
micro-batch: the median `triggerExecution` (and each phase of Spark's `durationMs`) of `--batches` small
micro-batches (`--small` rows, all partitions) of the `ottla -> ottla` exactly-once query minus that of
`rate-micro-batch -> noop`, first batch of each left out; and the CPU seconds per micro-batch of the Spark
JVM, every process under it and the broker over the same micro-batches: on a shared machine wall time
mostly measures the wait for a core, CPU time what the work costs. `--probes` times each Kafka client call,
data-source call and first import of the connector's modules in every Spark Python process (spark_timing/): per
leg and round, the calls' summed wall and CPU (a fresh worker's imports show in the round where it first runs
a task of the leg), the time the broker's and Spark's threads waited for a core, per task of each streaming leg
its reader's and writer's timeline and waits, and the median per call over the fixed-cost queries.
`--legs pipeline` (or any of sink, source, eos-sink, pipeline) runs only those legs and their ceilings, for
cheaper A/B runs; `--read-option` sets an option of the source's reads (e.g. a fetch size) in both read legs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

import ottla.testing
import spark_probes
from ottla.demo.query import spark_session

PARTITIONS = 4
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution", "cpu",
          "broker cpu")
# The null source's Arrow batches: 4,096 rows, what Ottla's source yielded up to 2026-11-27 (now one batch per
# Fetch answer, about 8,000 100-byte records); kept so that the ceiling stays comparable across entries.
CEILING_ROWS_PER_BATCH = 4096
TIMING_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_timing")


def null_source():
    """A Python data source that reads `rowsPerBatch` generated rows per micro-batch over PARTITIONS tasks and
    writes nowhere: the cost of Spark's Python data source machinery (a Python worker per task for the
    read and one for the write, the driver's planning and commit processes) without Kafka."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def __init__(self, rows_per_batch: int):
            self.rows = rows_per_batch

        def initialOffset(self):
            return {"batch": 0}

        def latestOffset(self, start=None, limit=None):
            return {"batch": (start or {"batch": 0})["batch"] + 1}

        def partitions(self, start, end):
            return [InputPartition(i) for i in range(PARTITIONS)]

        def read(self, partition):
            n = self.rows // PARTITIONS
            yield pa.RecordBatch.from_pydict({"key": [b"k"] * n, "value": [b"v" * 100] * n})

        def commit(self, end):
            pass

    class NullSource(DataSource):
        @classmethod
        def name(cls):
            return "null-python"

        def schema(self):
            return "key binary, value binary"

        def streamReader(self, schema):
            return Reader(int(self.options["rowsPerBatch"]))

        def streamWriter(self, schema, overwrite):
            return ceiling_source()({}).streamWriter(schema, overwrite)  # discards its input

    return NullSource


def ceiling_source():
    """`ceiling-python`: what any connector whose Spark workers are Python can at best reach. A Python data
    source with the ottla source's schema and partitioning (one task per partition of PARTITIONS, Arrow
    batches of the ottla source's size) whose reader yields prebuilt Arrow batches of the same rows as the
    ottla source returns (no I/O), and whose writers (batch and streaming, Arrow: the ottla sinks' path)
    discard their input. Options `rows` and `size`: the rows of `rows()`; `builds`: a file where each read task
    appends the CPU and wall seconds it took to build its batches, which the benchmark takes off the leg."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                        DataSourceStreamArrowWriter, DataSourceStreamReader, InputPartition,
                                        WriterCommitMessage)

    from ottla.spark.heap import freeze_worker_heap
    from ottla.spark.source import source_schema

    def read(options, first: int, end: int, partition: int):
        freeze_worker_heap()  # what any Python connector can do (ottla's tasks do it)
        probe = _Probe("ceiling read")
        cpu, wall = time.process_time(), time.monotonic()
        batches = _source_batches(first, end, int(options["size"]), "ceiling", partition)
        with open(options["builds"], "a") as report:  # the benchmark takes the building off the leg's time
            report.write(f"{time.process_time() - cpu} {time.monotonic() - wall}\n")
        yield from batches
        probe.done()

    def split(first: int, end: int) -> list:
        bounds = [first + (end - first) * i // PARTITIONS for i in range(PARTITIONS + 1)]
        return [InputPartition((lo, hi, i)) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]

    class Reader(DataSourceReader):
        def __init__(self, options):
            self.options = options

        def partitions(self):
            return split(0, int(self.options["rows"]))

        def read(self, partition):
            return read(self.options, *partition.value)

    class StreamReader(DataSourceStreamReader):
        def __init__(self, options):
            self.options = options

        def initialOffset(self):
            return {"row": 0}

        def latestOffset(self, start=None, limit=None):
            return {"row": int(self.options["rows"])}

        def partitions(self, start, end):
            return split(start["row"], end["row"])

        def read(self, partition):
            return read(self.options, *partition.value)

        def commit(self, end):
            pass

    class Writer(DataSourceArrowWriter):
        def write(self, iterator):
            freeze_worker_heap()
            probe = _Probe("ceiling write")
            for _ in iterator:
                pass
            probe.done()
            return WriterCommitMessage()

    class StreamWriter(DataSourceStreamArrowWriter):
        write = Writer.write

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class Ceiling(DataSource):
        @classmethod
        def name(cls):
            return "ceiling-python"

        def schema(self):
            return source_schema(False)

        def reader(self, schema):
            return Reader(self.options)

        def streamReader(self, schema):
            return StreamReader(self.options)

        def writer(self, schema, overwrite):
            return Writer()

        def streamWriter(self, schema, overwrite):
            return StreamWriter()

    return Ceiling


class _Probe:
    """With `--probes`, one record of a ceiling task's read or write in spark_timing's format (the per-task table
    sets it beside Ottla's reader and writer); its reader's record includes the building of its batches."""

    def __init__(self, name: str):
        self.name, self.path = name, os.environ.get("OTTLA_SPARK_TIMING")
        self.wall, self.cpu, self.queued = time.perf_counter(), time.process_time(), self._queued()

    @staticmethod
    def _queued() -> float:
        try:
            with open("/proc/thread-self/schedstat") as stat:
                return int(stat.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def done(self) -> None:
        if not self.path:
            return
        import json

        from pyspark import TaskContext

        record = {"pid": os.getpid(), "name": self.name, "wall": time.perf_counter() - self.wall,
                  "cpu": time.process_time() - self.cpu, "queued": self._queued() - self.queued, "at": time.time(),
                  "task": TaskContext.get().partitionId()}
        with open(self.path, "a") as out:
            out.write(json.dumps(record) + "\n")


def _source_batches(first: int, end: int, size: int, topic: str, partition: int) -> list:
    """Rows first..end-1 of `rows()` as the ottla source returns them, in its Arrow batches, built with numpy
    (about 0.03 s of CPU per 100,000 100-byte rows): key = the row number as text, value = the row number
    padded on the left with 'x' to `size` bytes."""
    import numpy as np
    import pyarrow as pa

    from ottla.spark.source import source_schema
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(source_schema(False), timezone="UTC")
    powers = 10 ** np.arange(19, -1, -1, dtype=np.uint64)  # a row number's digits, right-aligned in 20 bytes
    out = []
    for lo in range(first, end, CEILING_ROWS_PER_BATCH):
        count = min(CEILING_ROWS_PER_BATCH, end - lo)
        ids = np.arange(lo, lo + count, dtype=np.uint64)
        digits = (ids[:, None] // powers % 10 + ord("0")).astype(np.uint8)
        lengths = np.maximum(np.searchsorted(powers[::-1], ids, side="right"), 1)
        held = np.arange(20) >= 20 - lengths[:, None]
        values = np.full((count, size), ord("x"), np.uint8)
        values[:, size - 20:] = np.where(held, digits, ord("x"))
        key_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        value_offsets = np.arange(0, (count + 1) * size, size, dtype=np.int32)
        columns = [
            pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(key_offsets), pa.py_buffer(digits[held])]),
            pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(value_offsets),
                                                       pa.py_buffer(values.reshape(-1))]),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.array(ids.astype(np.int64)),
            pa.array(np.full(count, 1_764_000_000_000_000, np.int64), schema.field("timestamp").type),
            pa.array(np.zeros(count, np.int32)),
        ]
        out.append(pa.RecordBatch.from_arrays(columns, schema=schema))
    return out


def rows(spark, n: int, size: int):
    from pyspark.sql.functions import col, lpad
    value = lpad(col("id").cast("string"), size, "x").cast("binary").alias("value")
    return spark.range(0, n, numPartitions=PARTITIONS).select(col("id").cast("string").alias("key"), value)


def run_stream(writer, checkpoint: str) -> list[tuple[int, float]]:
    """Start an availableNow query; (rows, triggerExecution s) of each micro-batch that had rows."""
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    with_rows = [p for p in query.recentProgress if p["numInputRows"]]
    path = os.environ.get("OTTLA_SPARK_TIMING")
    if path:  # --probes: each phase of Spark's durationMs, as a probe record (wall: the phase's seconds)
        import json

        with open(path, "a") as out:
            for progress in with_rows:
                for phase, ms in progress["durationMs"].items():
                    out.write(json.dumps({"pid": 0, "name": f"micro-batch phase {phase}", "wall": ms / 1000,
                                          "cpu": 0.0, "at": time.time()}) + "\n")
    return [(p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000) for p in with_rows]


class Legs:
    def __init__(self, spark, bootstrap: str, workdir: str, broker_pid: int):
        self.spark, self.bootstrap, self.workdir, self.broker_pid = spark, bootstrap, workdir, broker_pid
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        self.topics = 0
        self.builds = os.path.join(workdir, "ceiling-builds")
        self.probes: str | None = None  # with --probes: the file each leg's probe records are taken from
        self.probed: dict[str, list[dict]] = {}  # leg -> its probe records, of the last `run`
        self.read_options: dict[str, str] = {}  # --read-option
        spark.dataSource.register(ceiling_source())

    def topic(self, label: str) -> str:
        self.topics += 1
        name = f"{label}-{self.topics}"
        self.admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
        return name

    def checkpoint(self) -> str:
        return tempfile.mkdtemp(dir=self.workdir)

    def ottla(self, **options):
        return {"kafka.bootstrap.servers": self.bootstrap, **options}

    def reading(self, **options):
        """`ottla` with the `--read-option`s: the options of the source and pipeline legs' reads."""
        return self.ottla(**options, **self.read_options)

    def measured(self, action) -> tuple[float, float, float]:
        """(the action's wall seconds, or what it returns; Spark's CPU seconds; the broker's CPU seconds).
        With `--probes`, also a probe record of the time the broker's and Spark's threads waited for a core."""
        spark_cpu, broker_cpu = self.cpu()
        queued = self.queued() if self.probes else None
        started = time.monotonic()
        seconds = action()
        wall = time.monotonic() - started
        end_spark, end_broker = self.cpu()
        if queued is not None:
            spark_probes.record_queued(self.probes, wall, [end - start for start, end in zip(queued, self.queued())])
        return (wall if seconds is None else seconds), end_spark - spark_cpu, end_broker - broker_cpu

    def queued(self) -> tuple[float, float, float]:
        """Seconds that the broker's event-loop thread, every thread of the broker, and of the Spark JVM's process
        tree waited for a core so far (live threads only: a Python worker that exits takes its part with it)."""
        return (spark_probes.thread_queued(self.broker_pid), spark_probes.tree_queued([self.broker_pid]),
                spark_probes.tree_queued([self.spark.sparkContext._gateway.proc.pid]))

    def run(self, n: int, size: int, ceiling_first: bool = False,
            chosen: frozenset | None = None) -> dict[str, tuple[float, float, float]]:
        """(seconds, Spark CPU seconds, broker CPU seconds) per leg for n rows of `size`-byte values, in
        `LEGS`' order. `range -> noop` first, then each chosen Ottla leg (`--legs`) and its ceiling
        (`ceiling_source`), the ceiling first with `ceiling_first`: the first large run of one of PySpark's
        Arrow exchange paths in a session pays the JVM's compilation of it (JIT), and whichever leg of a pair
        goes first pays it. The source and the pipeline read what the batch sink writes: without that leg
        chosen its write still runs, unmeasured."""
        from pyspark.sql.functions import col, lpad

        chosen = frozenset(LEG_NAMES) if chosen is None else chosen
        spark, out = self.spark, {}
        df = rows(spark, n, size)
        out["range -> noop"] = self.measured(lambda: df.write.format("noop").mode("overwrite").save())
        if self.probes:
            self.probed["range -> noop"] = spark_probes.take_probes(self.probes)
        source, sink, copy = self.topic(f"in{size}"), self.topic(f"eos{size}"), self.topic(f"copy{size}")
        read = spark.read.format("ottla").options(**self.reading(subscribe=source))
        null = spark.read.format("ceiling-python").options(**self.ceiling(n, size))
        rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", n)
                .option("numPartitions", PARTITIONS).load()
                .select(col("value").cast("string").alias("key"),
                        lpad(col("value").cast("string"), size, "x").cast("binary").alias("value")))
        stream = (spark.readStream.format("ottla").options(**self.reading(subscribe=source, startingOffsets="earliest"))
                  .load().selectExpr("key", "concat(CAST(value AS STRING), '.') AS value"))
        null_stream = (spark.readStream.format("ceiling-python").options(**self.ceiling(n, size)).load()
                       .selectExpr("key", "concat(CAST(value AS STRING), '.') AS value"))

        def pipeline():
            measured = self.measured(lambda: _seconds(
                run_stream(stream.writeStream.format("ottla").options(**self.ottla(topic=copy)), self.checkpoint()), n))
            self.check(copy, n)
            return measured

        pairs = [
            (lambda: self.measured(
                lambda: df.write.format("ottla").options(**self.ottla(topic=source)).mode("append").save()),
             lambda: self.measured(lambda: df.write.format("ceiling-python").mode("append").save())),
            (lambda: self.measured(lambda: read.load().write.format("noop").mode("overwrite").save()),
             lambda: self.ceiling_measured(lambda: null.load().write.format("noop").mode("overwrite").save())),
            (lambda: self.measured(lambda: _seconds(
                run_stream(rate.writeStream.format("ottla").options(**self.ottla(topic=sink)), self.checkpoint()), n)),
             lambda: self.measured(lambda: _seconds(
                 run_stream(rate.writeStream.format("ceiling-python"), self.checkpoint()), n))),
            (pipeline,
             lambda: self.ceiling_measured(lambda: _seconds(
                 run_stream(null_stream.writeStream.format("ceiling-python"), self.checkpoint()), n))),
        ]
        if "sink" not in chosen and chosen & {"source", "pipeline"}:
            df.write.format("ottla").options(**self.ottla(topic=source)).mode("append").save()
        if self.probes:  # the DataFrames' planning above (the streaming source's schema): not a leg's
            self.probed[SET_UP] = spark_probes.take_probes(self.probes)
        for (ottla_leg, ceiling_leg), (ottla_run, ceiling_run), name in zip(PAIRS, pairs, LEG_NAMES):
            if name not in chosen:
                continue
            for leg, action in ([(ceiling_leg, ceiling_run), (ottla_leg, ottla_run)] if ceiling_first
                                else [(ottla_leg, ottla_run), (ceiling_leg, ceiling_run)]):
                out[leg] = action()
                if self.probes:
                    self.probed[leg] = spark_probes.take_probes(self.probes)
        return {leg: out[leg] for leg in LEGS if leg in out}

    def ceiling(self, n: int, size: int) -> dict:
        return {"rows": n, "size": size, "builds": self.builds}

    def ceiling_measured(self, action) -> tuple[float, float, float]:
        """`measured`, less the ceiling reader's building of its batches: all of its CPU, and of its wall time
        the share of one of the two cores (tasks run two at a time)."""
        open(self.builds, "w").close()
        seconds, spark_cpu, broker_cpu = self.measured(action)
        with open(self.builds) as report:
            built = [tuple(map(float, line.split())) for line in report]
        return (seconds - sum(w for _, w in built) / 2, spark_cpu - sum(c for c, _ in built), broker_cpu)

    def check(self, name: str, n: int) -> None:
        from pyspark.sql.functions import count, count_distinct
        got = (self.spark.read.format("ottla").options(**self.ottla(subscribe=name)).load()
               .agg(count_distinct("value").alias("distinct"), count("value").alias("total")).first())
        if (got.distinct, got.total) != (n, n):
            raise RuntimeError(f"{name}: {got.total} records, {got.distinct} distinct values; expected {n} of each")

    def fixed_cost(self, small: int, batches: int) -> tuple[dict, dict, dict]:
        """Median seconds per phase of small micro-batches (first one left out), for `rate-micro-batch ->
        noop`, for a Python data source into a Python sink that do nothing, and for the `ottla -> ottla`
        exactly-once query; "cpu" is the CPU seconds per micro-batch of the Spark JVM with its Python
        processes, "broker cpu" that of the broker, over the same micro-batches."""
        spark = self.spark
        rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", small)
                .option("numPartitions", PARTITIONS).load())
        query = (rate.writeStream.format("noop").option("checkpointLocation", self.checkpoint())
                 .trigger(processingTime="0 seconds").start())
        spark_cost = self._watch(query, batches, stop=True)

        spark.dataSource.register(null_source())
        query = (spark.readStream.format("null-python").option("rowsPerBatch", small).load()
                 .writeStream.format("null-python").option("checkpointLocation", self.checkpoint())
                 .trigger(processingTime="0 seconds").start())
        python_cost = self._watch(query, batches, stop=True)

        source, sink = self.topic("small-in"), self.topic("small-out")
        rows(spark, small * batches, 100).write.format("ottla").options(**self.ottla(topic=source)) \
            .mode("append").save()
        stream = (spark.readStream.format("ottla")
                  .options(**self.ottla(subscribe=source, startingOffsets="earliest", maxOffsetsPerTrigger=small))
                  .load().select("key", "value"))
        query = (stream.writeStream.format("ottla").options(**self.ottla(topic=sink))
                 .option("checkpointLocation", self.checkpoint()).trigger(availableNow=True).start())
        return spark_cost, python_cost, self._watch(query, batches, stop=False)

    def _watch(self, query, batches: int, stop: bool) -> dict[str, float]:
        """Phase medians and CPU per micro-batch from the end of the first micro-batch with rows to the
        end of micro-batch `batches`."""
        def done():
            return [p for p in query.recentProgress if p["numInputRows"]]
        while not done():
            time.sleep(0.05)
        cpu, broker = self.cpu()
        first = len(done())
        while len(done()) < batches and query.isActive:
            time.sleep(0.05)
        end_cpu, end_broker = self.cpu()
        if stop:
            query.stop()
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        progress = done()[1:batches]
        if len(progress) != batches - 1:
            raise RuntimeError(f"expected {batches} micro-batches, got {len(progress) + 1}")
        counted = len(done()[:batches]) - first
        return {**_phases(progress), "cpu": (end_cpu - cpu) / counted, "broker cpu": (end_broker - broker) / counted}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the Spark JVM with every process under it, and of the broker."""
        spark = self.spark.sparkContext._gateway.proc.pid
        return spark_probes.tree_cpu([spark]), spark_probes.tree_cpu([self.broker_pid])


def _phases(progress: list) -> dict[str, float]:
    return {phase: statistics.median(p["durationMs"].get(phase, 0) / 1000 for p in progress) for phase in PHASES[:-2]}


def _seconds(batches: list[tuple[int, float]], n: int) -> float:
    if sum(r for r, _ in batches) != n:
        raise RuntimeError(f"expected {n} rows in the micro-batches, got {batches}")
    return sum(s for _, s in batches)


# Each Ottla leg and its ceiling, in the order they run (the source reads what the batch sink wrote), and
# every leg in the order of the tables.
PAIRS = [
    ("range -> ottla sink (batch)", "ceiling: range -> null Python sink (batch)"),
    ("ottla source -> noop", "ceiling: null Python source -> noop"),
    ("rate-micro-batch -> ottla sink (streaming, exactly-once)",
     "ceiling: rate-micro-batch -> null Python sink (streaming)"),
    ("ottla -> transform -> ottla (exactly-once)", "ceiling: null Python source -> transform -> null Python sink"),
]
LEGS = ["range -> noop"] + [leg for pair in PAIRS for leg in pair]
LEG_NAMES = ["sink", "source", "eos-sink", "pipeline"]  # `--legs`: each pair of PAIRS by a short name
SET_UP = "(the round's set-up: its DataFrames planned)"

# Issue 16's targets (share of `range -> noop`) and the ceiling leg each Ottla leg is held against.
TARGETS = {
    "ottla source -> noop": 0.8,
    "range -> ottla sink (batch)": 0.6,
    "rate-micro-batch -> ottla sink (streaming, exactly-once)": 0.6,
    "ottla -> transform -> ottla (exactly-once)": 0.5,
}
CEILING_OF = dict(PAIRS)


def _round_label(index: int, rounds: int, ceiling_first: bool) -> str:
    state = "cold: Ottla's first large tasks in the session" if index == 0 else "warm"
    order = "each ceiling before its Ottla leg" if ceiling_first else "each Ottla leg before its ceiling"
    return f"round {index + 1} of {rounds} ({state}; {order})"


def _print_legs(n: int, size: int, legs_measured: dict, label: str) -> None:
    base, _, _ = legs_measured["range -> noop"]
    base_cpu = sum(legs_measured["range -> noop"][1:])
    print(f"\n{n:,} rows of {size}-byte values, {label}:\n")
    print("| leg | rows/s | MB/s | share of `range -> noop` | CPU s: Spark + broker | share by CPU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for leg, (s, spark_cpu, broker_cpu) in legs_measured.items():
        print(f"| {leg} | {n / s:,.0f} | {n * size / s / 1e6:,.1f} | {base / s:.2f} | "
              f"{spark_cpu:.2f} + {broker_cpu:.2f} | {base_cpu / (spark_cpu + broker_cpu):.2f} |")
    print("\nagainst the ceiling (shares of `range -> noop`, wall / by CPU):\n")
    print("| leg | target | Ottla | ceiling (null Python data source) | Ottla's share of its ceiling, by CPU |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for leg, target in TARGETS.items():
        if leg not in legs_measured:
            continue
        (s, *cpu), (cs, *ccpu) = legs_measured[leg], legs_measured[CEILING_OF[leg]]
        print(f"| {leg} | {target} | {base / s:.2f} / {base_cpu / sum(cpu):.2f} | {base / cs:.2f} / "
              f"{base_cpu / sum(ccpu):.2f} | {sum(ccpu) / sum(cpu):.2f} |")


def _shares(legs_measured: dict, leg: str) -> tuple[float, float, float]:
    """(share of `range -> noop` by wall, by CPU, CPU seconds: Spark + broker) of one leg in one round."""
    base, *base_cpu = legs_measured["range -> noop"]
    seconds, *cpu = legs_measured[leg]
    return base / seconds, sum(base_cpu) / sum(cpu), sum(cpu)


def _print_cold_warm(n: int, size: int, rounds: list[dict]) -> None:
    """Round 1 (cold) beside the median of the later rounds (warm): a new user's first job is the cold one."""

    def median(leg: str) -> tuple[float, float, float]:
        per_round = [_shares(measured, leg) for measured in rounds[1:]]
        return tuple(statistics.median(values) for values in zip(*per_round))

    warm = "round 2" if len(rounds) == 2 else f"median of rounds 2-{len(rounds)}"
    print(f"\n{n:,} rows of {size}-byte values, cold (round 1) and warm ({warm}), shares of `range -> noop` in the "
          f"same round, wall / by CPU, and the leg's CPU s (Spark + broker):\n")
    print("| leg | target | cold: Ottla | cold: ceiling | warm: Ottla | warm: ceiling | Ottla's share of its ceiling "
          "by CPU, cold / warm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for leg, target in TARGETS.items():
        if leg not in rounds[0]:
            continue
        cold, cold_ceiling = _shares(rounds[0], leg), _shares(rounds[0], CEILING_OF[leg])
        warm, warm_ceiling = median(leg), median(CEILING_OF[leg])
        cells = [f"{wall:.2f} / {cpu:.2f} ({seconds:.2f} s)" for wall, cpu, seconds in (cold, cold_ceiling, warm,
                                                                                       warm_ceiling)]
        print(f"| {leg} | {target} | {' | '.join(cells)} | {cold_ceiling[2] / cold[2]:.2f} / "
              f"{warm_ceiling[2] / warm[2]:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000, help="rows of 100-byte values (default 400,000)")
    parser.add_argument("--rows-1k", type=int, default=100_000, help="rows of 1 KiB values (default 100,000)")
    parser.add_argument("--sizes", default="100,1024", help="value sizes to run, comma-separated ('' for none)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the legs per size, in the same session")
    parser.add_argument("--small", type=int, default=100, help="rows per micro-batch for the fixed cost")
    parser.add_argument("--batches", type=int, default=8,
                        help="micro-batches for the fixed cost (first left out; 0: no fixed cost)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--python", metavar="PATH",
                        help="the Spark Python workers' interpreter (default: this one), e.g. a venv with only "
                             "`pip install ottla[spark]`, as a new user has: no test tools (Hypothesis, which kio "
                             "loads when installed); Ottla's modules as PYTHONPATH or that venv has them")
    parser.add_argument("--probes", action="store_true",
                        help="time each Kafka client call and data-source call in every Spark Python process")
    parser.add_argument("--read-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the source and pipeline legs' reads (repeatable), e.g. "
                             "kafka.max.partition.fetch.bytes=4194304")
    parser.add_argument("--legs", default=",".join(LEG_NAMES),
                        help=f"the Ottla legs to run with their ceilings, comma-separated, of {','.join(LEG_NAMES)} "
                             "(default: all; `range -> noop` always runs)")
    args = parser.parse_args()
    chosen = frozenset(leg for leg in args.legs.split(",") if leg)
    if not chosen <= set(LEG_NAMES):
        parser.error(f"--legs: unknown {sorted(chosen - set(LEG_NAMES))}; choose among {','.join(LEG_NAMES)}")
    if args.probes:
        probes = tempfile.NamedTemporaryFile(prefix="ottla-probes-", suffix=".jsonl", delete=False).name
        os.environ["OTTLA_SPARK_TIMING"] = probes
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TIMING_DIR, os.environ.get("PYTHONPATH")) if p)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    results, summaries = [], []
    with ottla.testing.broker() as broker, tempfile.TemporaryDirectory(prefix="ottla-bench-") as workdir:
        spark = spark_session("ottla-bench", dict(item.split("=", 1) for item in args.conf), args.python)
        legs = Legs(spark, broker.bootstrap, workdir, broker.pid)
        legs.read_options = dict(item.split("=", 1) for item in args.read_option)
        print(f"warm-up: {legs.run(2_000, 100, chosen=chosen)}", file=sys.stderr)  # JIT, Python workers
        legs.probes, probed = (probes if args.probes else None), []
        if args.probes:
            open(probes, "w").close()  # not the warm-up's
        for size in (int(s) for s in args.sizes.split(",") if s):
            n = args.rows if size < 1024 else args.rows_1k
            rounds = []
            for index in range(args.rounds):
                # Round 1 runs each ceiling first, so that Spark's JIT of its exchange paths is charged to the
                # null source (Spark's cost) and the Ottla leg pays only its own first use; then alternately.
                ceiling_first = index % 2 == 0
                rounds.append(legs.run(n, size, ceiling_first, chosen))
                probed.append((n, size, index, dict(legs.probed)))
                print(f"{size}-byte values, load {os.getloadavg()[0]:.1f}: {rounds[-1]}", file=sys.stderr)
                results.append((n, size, rounds[-1], _round_label(index, args.rounds, ceiling_first)))
            summaries.append((n, size, rounds))
        if args.probes:
            open(probes, "w").close()  # the fixed-cost queries only
        costs = legs.fixed_cost(args.small, args.batches) if args.batches else None
        spark.stop()

    for n, size, legs_measured, label in results:
        _print_legs(n, size, legs_measured, label)
    for n, size, rounds in summaries:
        if len(rounds) > 1:
            _print_cold_warm(n, size, rounds)
        if args.probes:
            mine = [legs_probed for n2, size2, _, legs_probed in probed if (n2, size2) == (n, size)]
            spark_probes.leg_probe_table(n, size, mine, [SET_UP] + LEGS)
    if costs:
        spark_cost, python_cost, ottla_cost = costs
        print(f"\nfixed cost per micro-batch ({args.small} rows, {PARTITIONS} partitions, median of "
              f"{args.batches - 1} micro-batches, seconds):\n")
        print("(phases: Spark's durationMs, wall; cpu: CPU s per micro-batch of the Spark JVM and its Python "
              "processes; broker cpu: the broker's)\n")
        print("| phase | `rate-micro-batch -> noop` | Python source -> Python sink, both empty | `ottla -> ottla` "
              "exactly-once | Ottla adds to `rate -> noop` | Ottla adds to the empty Python pair |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for phase in PHASES:
            print(f"| {phase} | {spark_cost[phase]:.3f} | {python_cost[phase]:.3f} | {ottla_cost[phase]:.3f} | "
                  f"{ottla_cost[phase] - spark_cost[phase]:.3f} | {ottla_cost[phase] - python_cost[phase]:.3f} |")
    if args.probes and costs:
        spark_probes.probe_table(probes, args.batches)
    print()
    print(f"- {os.cpu_count()} CPUs, Spark local[2,3]; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; run took {time.monotonic() - started:.0f}s")
    print(f"- command: python benchmarks/spark_pipeline.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
