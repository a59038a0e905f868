"""CPU per record of the Spark data source's worker-side code, in this process, without Spark (issue 16).

    .venv/bin/python benchmarks/spark_workers.py                       # 400,000 x 100 B, 3 runs
    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/spark_workers.py   # another tree's ottla.spark
    .venv/bin/python benchmarks/spark_workers.py --encoder numba        # a warm worker's encoder (kernels.py)

One broker (`ottla serve`), a topic of 4 partitions. What a Spark Python worker runs per task, on the same
records as `spark_pipeline.py`'s 100-byte legs (key = the row number as a string, value = the row number
padded to the size):

- sink: the at-least-once writer's produce path (`rdkafka.produce_batch` over Arrow batches of 10,000 rows, then
  `flush`) with a new idempotent producer per run, through confluent-kafka and through Ottla's own producer
  (`_send_batch`: batches encoded from the Arrow columns);
- source: `read_range` over each partition's whole range (read_committed), every Arrow batch taken.

The modules a Spark Python worker has loaded are imported first: Python's cyclic garbage collector walks
that heap, so its cost in a worker shows here too. CPU is this process's (librdkafka's threads included)
and, for the sink, its main thread's alone; the broker's CPU apart. Spark's own share (the JVM's Arrow
exchange with the worker) is not here: `spark_pipeline.py` measures the legs whole.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pyarrow as pa
import pyspark.sql.worker.plan_data_source_read  # noqa: F401  (a Spark Python worker's heap)
import pyspark.sql.worker.write_into_data_source  # noqa: F401
import pyspark.worker  # noqa: F401
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import ottla.testing
from ottla.spark import rdkafka, record_batches, sink, source

try:
    from ottla.spark import compiled  # the one numba switch (2026-11-28 on)
except ImportError:
    compiled = None
from ottla.spark.options import parse_read_options, parse_write_options
from ottla.spark.producer import OwnProducer
from ottla.spark.source import OffsetRange, source_schema

PARTITIONS = 4
ROWS_PER_SPARK_BATCH = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
_TICKS = os.sysconf("SC_CLK_TCK")


class TaskContext:
    """What the sink reads of Spark's TaskContext, for driving its write tasks without Spark: the
    benchmark sets `TaskContext.current` before each task."""

    current: TaskContext

    def __init__(self, batch: int, partition: int, query: str = "bench"):
        self.props = {"streaming.sql.batchId": str(batch), "sql.streaming.queryId": query}
        self.partition = partition

    @staticmethod
    def get() -> TaskContext:
        return TaskContext.current

    def partitionId(self) -> int:
        return self.partition

    def getLocalProperty(self, key: str) -> str:
        return self.props[key]


def broker_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def spark_batches(n: int, size: int) -> list:
    out = []
    for low in range(0, n, ROWS_PER_SPARK_BATCH):
        ids = range(low, min(n, low + ROWS_PER_SPARK_BATCH))
        out.append(pa.RecordBatch.from_arrays([pa.array([str(i) for i in ids], pa.string()),
                                               pa.array([str(i).rjust(size, "x").encode() for i in ids], pa.binary())],
                                              names=["key", "value"]))
    return out


def write(bootstrap: str, topic: str, batches: list) -> float:
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": topic}, streaming=False)
    failures: list[str] = []
    producer = Producer(rdkafka.producer_config(options, failures, **{"enable.idempotence": True}))
    producer.list_topics(topic, timeout=30)  # connected before the clock starts, as a kept producer is
    started = time.thread_time()
    for batch in batches:
        rdkafka.produce_batch(producer, batch, topic)
    if producer.flush(60) or failures:
        raise RuntimeError(f"not delivered: {failures[:1]}")
    return time.thread_time() - started


def write_own(bootstrap: str, topic: str, batches: list) -> float:
    producer = OwnProducer({"bootstrap.servers": bootstrap}, 60)
    producer.partitions(topic)  # connected before the clock starts, as a kept producer is
    started = time.thread_time()
    for batch in batches:
        sink._send_batch(producer, batch, topic)
    producer.flush()
    producer.close()
    return time.thread_time() - started


def read(bootstrap: str, topic: str, ranges: list[OffsetRange]) -> int:
    options = parse_read_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    schema = source_schema(False)
    return sum(batch.num_rows for rng in ranges for batch in source.read_range(rng, options, schema))


def measured(broker_pid: int, action) -> tuple:
    cpu, wall, broker = time.process_time(), time.monotonic(), broker_cpu(broker_pid)
    result = action()
    return result, time.process_time() - cpu, time.monotonic() - wall, broker_cpu(broker_pid) - broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--encoder", choices=["numpy", "numba"],
                        help="the own producer's encoder throughout (default: numpy until it has cost numba's load)")
    args = parser.parse_args()
    switch = compiled if compiled is not None else record_batches  # trees before 2026-11-28: the encoder's own
    if args.encoder and hasattr(switch, "COMPILED_AFTER_SECONDS"):
        switch.COMPILED_AFTER_SECONDS = 0 if args.encoder == "numba" else float("inf")
    n = args.rows
    load_before = os.getloadavg()[0]
    batches = spark_batches(n, args.size)
    print("| run | leg | CPU us/record | main thread us/record | wall s | broker CPU s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        watermarks = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "spark-workers"})
        for run in range(1, args.runs + 1):
            topic = f"workers-{run}"
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
            main_thread, cpu, wall, broker_s = measured(broker.pid, lambda: write(broker.bootstrap, topic, batches))
            print(f"| {run} | sink: `rdkafka.produce_batch` + flush | {cpu / n * 1e6:.2f} | {main_thread / n * 1e6:.2f} | "
                  f"{wall:.2f} | {broker_s:.2f} |", flush=True)
            own = f"{topic}-own"
            admin.create_topics([NewTopic(own, PARTITIONS, 1)])[own].result(30)
            main_thread, cpu, wall, broker_s = measured(broker.pid, lambda: write_own(broker.bootstrap, own, batches))
            print(f"| {run} | sink: own producer, `_send_batch` + flush | {cpu / n * 1e6:.2f} | "
                  f"{main_thread / n * 1e6:.2f} | {wall:.2f} | {broker_s:.2f} |", flush=True)
            ranges = [OffsetRange(topic, p, *watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=30))
                      for p in range(PARTITIONS)]
            rows, cpu, wall, broker_s = measured(broker.pid, lambda: read(broker.bootstrap, topic, ranges))
            if rows != n:
                raise RuntimeError(f"read {rows} records of {n}")
            print(f"| {run} | source: `read_range` | {cpu / n * 1e6:.2f} | | {wall:.2f} | {broker_s:.2f} |", flush=True)
        watermarks.close()
    print(f"\n- {n:,} records of {args.size} bytes; {os.cpu_count()} CPUs; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/spark_workers.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
