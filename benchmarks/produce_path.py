"""The broker's CPU per produced record for the Spark sinks' requests, without Spark (issue 16).

    PYTHONPATH=src .venv/bin/python benchmarks/produce_path.py               # 1,600,000 x 100 B, 5 runs
    PYTHONPATH=src .venv/bin/python benchmarks/produce_path.py --size 1024 --runs 3

One broker (`ottla serve`), a topic of 4 partitions (RF 1) per run and path. The records are those of
`spark_pipeline.py`'s legs (key = the row number as a string, value = the row number padded to the size),
sent by the sinks' own producers (`ottla.spark.producer`) in Arrow batches of 10,000 rows: one uncompressed
v2 batch of ~2,500 records per partition per Produce v9 request, acks=all.

- idempotent: the batch sink's `OwnProducer` (one producer, `send` per Arrow batch, then `flush`);
- transactional: the streaming exactly-once sink's `TransactionalProducer`, one transaction per quarter of
  the rows (a Spark task's share in `spark_pipeline.py`: AddPartitionsToTxn, Produce..., EndTxn).

The broker's CPU (user + system, /proc/<pid>/stat) is scaled to 400,000 records; the producer runs in this
process and is not counted. Records/s is wall time, client included (2 CPUs are shared with it).

`--transactions N` then runs N small transactions of one producer as the exactly-once sink's tasks make them
(`TransactionalProducer`: begin, AddOffsetsToTxn + TxnOffsetCommit of a marker offset, one Arrow batch of 100
rows over the 4 partitions, EndTxn commit) and prints the broker's CPU and the wall time per transaction:
the fixed cost a micro-batch pays per task, whatever its size.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from brokerproc import cpu_seconds
from confluent_kafka.admin import AdminClient, NewTopic

import ottla.testing
from ottla.spark.producer import OwnProducer
from ottla.spark.record_batches import Columns
from ottla.spark.transactional import TransactionalProducer

PARTITIONS = 4
ROWS_PER_ARROW_BATCH = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
PER = 400_000


def arrow_batches(n: int, size: int) -> list[Columns]:
    out = []
    for low in range(0, n, ROWS_PER_ARROW_BATCH):
        ids = range(low, min(n, low + ROWS_PER_ARROW_BATCH))
        out.append(Columns(pa.array([str(i).rjust(size, "x").encode() for i in ids], pa.binary()),
                           pa.array([str(i) for i in ids], pa.string())))
    return out


def idempotent(bootstrap: str, topic: str, batches: list[Columns]) -> None:
    producer = OwnProducer({"bootstrap.servers": bootstrap}, 60)
    try:
        for columns in batches:
            producer.send(topic, columns)
        producer.flush()
    finally:
        producer.close()


def transactional(bootstrap: str, topic: str, batches: list[Columns]) -> None:
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, f"bench-{topic}", 60)
    try:
        for task in range(PARTITIONS):
            producer.begin()
            for columns in batches[task::PARTITIONS]:
                producer.send(topic, columns)
            producer.commit()
    finally:
        producer.close()


PATHS = {"idempotent": idempotent, "transactional": transactional}


def small_transactions(broker, admin, count: int) -> tuple[float, float]:
    """(broker CPU ms, wall ms) per transaction of `count` small ones (see the module's docstring)."""
    for name, partitions in (("txn-data", PARTITIONS), ("txn-marker", 1)):
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    rows = arrow_batches(100, 100)[0]
    producer = TransactionalProducer({"bootstrap.servers": broker.bootstrap}, "bench-small-txn", 60)

    def one(i: int) -> None:
        producer.begin()
        producer.send_offsets("bench-small-txn", "txn-marker", 0, i)
        producer.send("txn-data", rows)
        producer.commit()
    try:
        for i in range(5):  # first-use costs not counted
            one(i)
        cpu, wall = cpu_seconds(broker.pid), time.monotonic()
        for i in range(5, 5 + count):
            one(i)
        return (cpu_seconds(broker.pid) - cpu) * 1000 / count, (time.monotonic() - wall) * 1000 / count
    finally:
        producer.close()
_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """User and system CPU seconds of each of a process's threads, by thread id and name."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rpartition(")")[2].split()
        out[f"{tid} {name}"] = (int(fields[11]) / _TICK, int(fields[12]) / _TICK)
    return out


@contextmanager
def watched(pid: int, py_spy: str | None, threads: bool) -> Iterator[None]:
    """While the body runs: py-spy samples the broker into `py_spy` (if given); after it, with `threads`, the
    broker's CPU by thread over the body is printed."""
    spy = py_spy and subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "250", "--threads",
         "--format", "raw", *(["--native"] if os.environ.get("PY_SPY_NATIVE") else []), "--output", py_spy],
        stdout=subprocess.DEVNULL)
    before = thread_cpu(pid)
    try:
        yield
    finally:
        if threads:
            for thread, (user, system) in sorted(thread_cpu(pid).items()):
                start = before.get(thread, (0.0, 0.0))
                if user + system > sum(start):
                    print(f"- thread {thread}: user {user - start[0]:.2f} s, system {system - start[1]:.2f} s")
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4 * PER, help="records per run (CPU is read in 10 ms ticks)")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--transactions", type=int, default=0, help="then this many small transactions")
    parser.add_argument("--threads", action="store_true", help="print the broker's CPU by thread, all runs")
    parser.add_argument("--py-spy", metavar="FILE", help="sample the broker with py-spy into FILE (collapsed stacks)")
    args = parser.parse_args()
    paths = args.paths.split(",")
    batches = arrow_batches(args.rows, args.size)
    results: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    loads = [os.getloadavg()[0]]
    print(f"| run | path | broker CPU s per {PER:,} records | records/s | load |")
    print("| ---: | --- | ---: | ---: | ---: |")
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("warm-up", PARTITIONS, 1)])["warm-up"].result(30)
        PATHS[paths[0]](broker.bootstrap, "warm-up", batches[:8])  # imports and first-use costs not counted
        with watched(broker.pid, args.py_spy, args.threads):
            for run in range(1, args.runs + 1):
                for path in paths:  # alternated, so a change in load hits both
                    topic = f"produce-{path}-{run}"
                    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                    time.sleep(0.2)  # the topic's creation is not counted
                    cpu, wall = cpu_seconds(broker.pid), time.monotonic()
                    PATHS[path](broker.bootstrap, topic, batches)
                    cpu, wall = cpu_seconds(broker.pid) - cpu, time.monotonic() - wall
                    per = cpu * PER / args.rows
                    results[path].append((per, args.rows / wall))
                    loads.append(os.getloadavg()[0])
                    print(f"| {run} | {path} | {per:.3f} | {args.rows / wall:,.0f} | {loads[-1]:.1f} |", flush=True)
            per_txn = small_transactions(broker, admin, args.transactions) if args.transactions else None
            del admin  # librdkafka's threads gone before the broker stops
    print()
    for path, rows in results.items():
        print(f"- {path}: broker CPU per {PER:,} records median {statistics.median(r[0] for r in rows):.3f} s "
              f"(least {min(r[0] for r in rows):.3f}: load only adds), median {statistics.median(r[1] for r in rows):,.0f} "
              "records/s")
    if per_txn:
        print(f"- {args.transactions} small transactions (100 rows each): broker CPU {per_txn[0]:.2f} ms and wall "
              f"{per_txn[1]:.1f} ms per transaction, load {os.getloadavg()[0]:.1f}")
    print(f"- {args.rows:,} records of {args.size} bytes per run; {os.cpu_count()} CPUs; load average "
          f"{min(loads):.1f}-{max(loads):.1f}")
    print(f"- command: python benchmarks/produce_path.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
