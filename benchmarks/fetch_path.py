"""The broker's CPU per fetched record for the Spark source's Fetch requests, without Spark (issue 16).

    PYTHONPATH=src .venv/bin/python benchmarks/fetch_path.py                # 400,000 x 100 B, 5 runs
    PYTHONPATH=src .venv/bin/python benchmarks/fetch_path.py --size 1024 --runs 3 --py-spy fetch.txt

One broker (`ottla serve`) and two topics of 4 partitions (RF 1), written once with the records of
`spark_pipeline.py`'s legs (key = the row number as a string, value = the row number padded to the size)
by the sinks' own producers in Arrow batches of 10,000 rows, as `produce_path.py` sends them:

- idempotent: the batch sink's `OwnProducer` (what the `ottla source -> noop` leg reads);
- transactional: the exactly-once sink's `TransactionalProducer`, one transaction per quarter of the rows,
  each quarter's last transaction aborted when `--aborted` (commit markers, and aborted batches the
  read_committed reader must be told of: the transaction index is looked up).

Each run reads every partition from offset 0 to its end with the Spark source's own reader
(`ottla.spark.fetch.read_columns`: one Fetch per answer, the next one sent before an answer is decoded (since
2026-11-28), `max.partition.fetch.bytes` and `max_bytes` the reader's default (1 MiB, 2 MiB since 2026-11-28),
`fetch.wait.max.ms` 10), once read_committed and once read_uncommitted, alternated. The broker's CPU (user +
system, /proc/<pid>/stat) is scaled to 400,000 records; the reader runs in this process (its decoding is not
counted). Requests: Fetch answers with records; bytes: the record bytes of the topic's log files. Also the
broker's CPU per second while no client asks anything (`--idle` seconds, after the warm-up read): what it
takes from the CPUs it shares with Spark whatever the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from brokerproc import cpu_seconds
from confluent_kafka.admin import AdminClient, NewTopic
from produce_path import PARTITIONS, PER, arrow_batches, idempotent, watched

import ottla.testing
from ottla.spark.fetch import read_columns
from ottla.spark.options import parse_read_options
from ottla.spark.transactional import TransactionalProducer


def transactional(bootstrap: str, topic: str, batches: list, aborted: bool) -> None:
    """One transaction per Arrow batch, the last of each quarter aborted with `aborted`."""
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, f"bench-{topic}", 60)
    quarter = max(1, len(batches) // PARTITIONS)
    try:
        for i, columns in enumerate(batches):
            producer.begin()
            producer.send(topic, columns)
            if aborted and i % quarter == quarter - 1:
                producer.abort()
            else:
                producer.commit()
    finally:
        producer.close()


def read_all(bootstrap: str, topic: str, committed: bool, ends: list[int]) -> tuple[int, int]:
    """(records, Fetch answers with records) of every partition, read as the Spark source reads."""
    options = parse_read_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                  "kafka.isolation.level": "read_committed" if committed else "read_uncommitted"})
    records = answers = 0
    for partition, end in enumerate(ends):
        for columns in read_columns(topic, partition, 0, end, options, None):
            records += len(columns)
            answers += 1
    return records, answers


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fetch-path"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)]
    finally:
        consumer.close()


def log_bytes(data_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for p in range(PARTITIONS) for f in (data_dir / f"{topic}-{p}").glob("*.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=PER, help="records per topic (CPU is read in 10 ms ticks)")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--aborted", action="store_true", help="abort one transaction in four of the transactional topic")
    parser.add_argument("--topics", default="idempotent,transactional")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the broker's CPU is read while idle")
    parser.add_argument("--threads", action="store_true", help="print the broker's CPU by thread, all runs")
    parser.add_argument("--py-spy", metavar="FILE", help="sample the broker with py-spy into FILE (collapsed stacks)")
    args = parser.parse_args()
    batches = arrow_batches(args.rows, args.size)
    kinds = args.topics.split(",")
    loads = [os.getloadavg()[0]]
    results: dict[tuple[str, str], list[float]] = {}
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for kind in kinds:
            admin.create_topics([NewTopic(kind, PARTITIONS, 1)])[kind].result(30)
        if "idempotent" in kinds:
            idempotent(broker.bootstrap, "idempotent", batches)
        if "transactional" in kinds:
            transactional(broker.bootstrap, "transactional", batches, args.aborted)
        ends = {kind: end_offsets(broker.bootstrap, kind) for kind in kinds}
        sizes = {kind: log_bytes(broker.data_dir, kind) for kind in kinds}
        read_all(broker.bootstrap, kinds[0], True, ends[kinds[0]])  # imports, first-use costs, page cache
        time.sleep(1)
        idle = cpu_seconds(broker.pid)
        time.sleep(args.idle)
        idle = (cpu_seconds(broker.pid) - idle) / args.idle
        print(f"| run | topic | isolation | broker CPU s per {PER:,} records | records | Fetch answers | "
              "MB | records/s | load |")
        print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        with watched(broker.pid, args.py_spy, args.threads):
            for run in range(1, args.runs + 1):
                for kind in kinds:
                    for committed in ((True, False) if run % 2 else (False, True)):  # alternated
                        isolation = "read_committed" if committed else "read_uncommitted"
                        cpu, wall = cpu_seconds(broker.pid), time.monotonic()
                        records, answers = read_all(broker.bootstrap, kind, committed, ends[kind])
                        cpu, wall = cpu_seconds(broker.pid) - cpu, time.monotonic() - wall
                        per = cpu * PER / records
                        results.setdefault((kind, isolation), []).append(per)
                        loads.append(os.getloadavg()[0])
                        print(f"| {run} | {kind} | {isolation} | {per:.3f} | {records:,} | {answers} | "
                              f"{sizes[kind] / 1e6:.1f} | {records / wall:,.0f} | {loads[-1]:.1f} |", flush=True)
            del admin
    print()
    for (kind, isolation), values in results.items():
        print(f"- {kind} {isolation}: broker CPU per {PER:,} records median {statistics.median(values):.3f} s "
              f"(least {min(values):.3f}: load only adds)")
    print(f"- the broker idle (no client request) for {args.idle:.0f} s: {idle * 1000:.1f} ms of CPU per second")
    print(f"- {args.rows:,} records of {args.size} bytes per topic; {os.cpu_count()} CPUs; load average "
          f"{min(loads):.1f}-{max(loads):.1f}")
    print(f"- command: python benchmarks/fetch_path.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
