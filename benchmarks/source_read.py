"""CPU per record of the Spark source's read path by stage, in this process, without Spark (issue 16).

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/source_read.py     # 400,000 records a payload, 5 runs

One broker (`ottla serve`), a topic of 4 partitions per payload, written by Ottla's own producer as the
sink writes: `fixed`, spark_workers.py's records (key = the row number as a string, value = the row number
padded to 100 bytes: records of one size in long runs), and `json`, values of 30-170 bytes that differ
from record to record (a small JSON document with a random-length note). Stages, each over every
partition's whole range (read_committed):

- fetch: the read tasks' Fetch requests and answers alone (`fetch._Reader._request`), no decoding;
- decode: `columns.decode_record_set` over the answers the fetch stage kept, with walk.py (what a Spark
  worker runs until walk.py has cost it `COMPILED_AFTER_SECONDS` more than numba would have) and with
  kernels.py (numba; its load is not counted: it is paid once per worker);
- read_range: `source.read_range` whole (Fetch, decode, the Arrow record batches Spark takes), with each
  walker.

CPU is this process's (best and median of the runs); the broker's CPU, for the fetch stage, from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np
import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic

import ottla.testing
from ottla.spark import columns, source
from ottla.spark.fetch import _Reader
from ottla.spark.options import parse_read_options
from ottla.spark.producer import OwnProducer
from ottla.spark.sink import _send_batch
from ottla.spark.source import OffsetRange, source_schema
from ottla.spark.walk import BASE, LAST_DELTA, scan_batches

try:
    from ottla.spark import compiled  # the one numba switch (2026-11-28 on)
except ImportError:
    compiled = None

sys.path.insert(0, os.path.dirname(__file__))
from spark_workers import PARTITIONS, ROWS_PER_SPARK_BATCH, broker_cpu, spark_batches  # noqa: E402


def json_batches(n: int) -> list:
    rnd = random.Random(16)
    out = []
    for low in range(0, n, ROWS_PER_SPARK_BATCH):
        ids = range(low, min(n, low + ROWS_PER_SPARK_BATCH))
        values = [json.dumps({"id": i, "user": f"u{rnd.randrange(10 ** rnd.randrange(1, 7))}",
                              "amount": round(rnd.random() * 10 ** rnd.randrange(1, 6), 2),
                              "note": "x" * rnd.randrange(0, 90)}).encode() for i in ids]
        out.append(pa.RecordBatch.from_arrays([pa.array([str(i) for i in ids], pa.string()),
                                               pa.array(values, pa.binary())], names=["key", "value"]))
    return out


def fetch_all(options, ranges: list[OffsetRange], kept: list | None) -> int:
    """Every answer's record set over the ranges, as the read tasks ask for them; returns the bytes."""
    total = 0
    for rng in ranges:
        reader, position = _Reader(rng.topic, rng.partition, options), rng.start
        while position < rng.end:
            records = reader._request(position).records or b""
            batches = scan_batches(np.frombuffer(records, np.uint8))
            if kept is not None:
                kept.append((records, position, rng.end))
            total += len(records)
            position = int(batches[BASE, -1] + batches[LAST_DELTA, -1]) + 1
    return total


def decode_all(answers: list, aborted) -> int:
    return sum(len(columns.decode_record_set(records, start, end, aborted)) for records, start, end in answers)


def read_all(options, ranges: list[OffsetRange]) -> int:
    schema = source_schema(False)
    return sum(batch.num_rows for rng in ranges for batch in source.read_range(rng, options, schema))


def timed(runs: int, action, broker_pid: int) -> tuple[list[float], list[float]]:
    action()  # warm: the client connected, the walker's modules loaded
    cpu, broker = [], []
    for _ in range(runs):
        started, broker_started = time.process_time(), broker_cpu(broker_pid)
        action()
        cpu.append(time.process_time() - started)
        broker.append(broker_cpu(broker_pid) - broker_started)
    return sorted(cpu), sorted(broker)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--payloads", default="fixed,json")
    args = parser.parse_args()
    n = args.rows
    load_before = os.getloadavg()[0]
    print("| payload | stage | walker | CPU us/record, best | median | broker CPU us/record, median |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for payload in args.payloads.split(","):
            topic = f"source-read-{payload}"
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
            producer = OwnProducer({"bootstrap.servers": broker.bootstrap}, 60)
            for batch in spark_batches(n, 100) if payload == "fixed" else json_batches(n):
                _send_batch(producer, batch, topic)
            producer.flush()
            producer.close()
            options = parse_read_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic})
            latest = source.Cluster(options).latest([(topic, p) for p in range(PARTITIONS)])
            ends = [latest[(topic, p)] for p in range(PARTITIONS)]
            ranges = [OffsetRange(topic, p, 0, end) for p, end in enumerate(ends)]
            if sum(ends) != n:
                raise RuntimeError(f"{sum(ends)} records written of {n}")
            answers: list = []
            fetch_all(options, ranges, answers)
            stages = [("fetch", "", lambda: fetch_all(options, ranges, None))]
            for walker, threshold in (("walk.py", float("inf")), ("kernels.py", 0)):
                stages += [("decode", walker, lambda t=threshold: _with(t, lambda: decode_all(answers, []))),
                           ("read_range", walker, lambda t=threshold: _with(t, lambda: read_all(options, ranges)))]
            for stage, walker, action in stages:
                cpu, broker_s = timed(args.runs, action, broker.pid)
                middle = len(cpu) // 2
                print(f"| {payload} | {stage} | {walker} | {cpu[0] / n * 1e6:.3f} | {cpu[middle] / n * 1e6:.3f} | "
                      f"{broker_s[middle] / n * 1e6:.3f} |", flush=True)
    print(f"\n- {n:,} records a payload, {args.runs} runs a stage; {os.cpu_count()} CPUs; load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/source_read.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


def _with(threshold: float, action):
    """Run `action` with the decoder's walker chosen by its numba threshold (0 or infinite; in seconds of
    CPU, or in records in trees before 2026-11-27 21:50, which this benchmark also measures)."""
    switch = compiled if compiled is not None else columns  # trees before 2026-11-28: the decoder's own
    name = "COMPILED_AFTER_SECONDS" if hasattr(switch, "COMPILED_AFTER_SECONDS") else "COMPILED_AFTER_RECORDS"
    saved = getattr(switch, name)
    setattr(switch, name, threshold if name.endswith("SECONDS") or not threshold else 1 << 62)
    try:
        return action()
    finally:
        setattr(switch, name, saved)


if __name__ == "__main__":
    sys.exit(main())
