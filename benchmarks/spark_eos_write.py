"""CPU per record of the exactly-once sink's write tasks, in this process, without Spark (issue 16): the own
transactional producer (`ottla.spark.transactional`) against confluent-kafka's, on the same rows.

    .venv/bin/python benchmarks/spark_eos_write.py                     # 400,000 x 100 B, 3 runs
    .venv/bin/python benchmarks/spark_eos_write.py --rows 100000 --size 1024

One broker (`ottla serve`), a topic of 4 partitions. Per run and path, two micro-batches of 4 write tasks
(Spark partitions 0-3, each a quarter of the rows as Arrow batches of 10,000, `spark_workers.py`'s rows): the
first with new producers (FindCoordinator, InitProducerId, the marker read), the second with the producers the
"worker" kept. Each task is `StreamWriter.write` as a Spark Python worker calls it, under a stand-in for Spark's
TaskContext (batch id, query id, partition). CPU is this process's (librdkafka's threads included); the
broker's apart. Spark's own share (the JVM's Arrow exchange) is not here: `spark_pipeline.py` has the legs whole.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic
from spark_workers import PARTITIONS, TaskContext, broker_cpu, spark_batches

import ottla.testing
from ottla.spark import sink
from ottla.spark.options import parse_write_options


def micro_batches(bootstrap: str, topic: str, batches: list, own: bool) -> int:
    """Two micro-batches of PARTITIONS tasks each; the rows written."""
    sink.TaskContext = TaskContext
    sink.own_producer.supports = (lambda client: True) if own else (lambda client: False)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": topic}, streaming=True)
    written = 0
    for batch_id in range(2):
        for partition in range(PARTITIONS):
            TaskContext.current = TaskContext(batch_id, partition)
            written += sink.StreamWriter(options).write(iter(batches[partition::PARTITIONS])).records
    for task in sink._TRANSACTIONAL.values():
        task.close()
    sink._TRANSACTIONAL.clear()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000, help="rows per micro-batch")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.rows
    load_before = os.getloadavg()[0]
    batches = spark_batches(n, args.size)
    supports = sink.own_producer.supports
    print("| run | path | CPU us/record | wall s | broker CPU s |")
    print("| ---: | --- | ---: | ---: | ---: |")
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for run in range(1, args.runs + 1):
            for own, label in ((False, "confluent-kafka, produce() per row"), (True, "own transactional producer")):
                topic = f"eos-{run}-{'own' if own else 'rdkafka'}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                cpu, wall, broker_s = time.process_time(), time.monotonic(), broker_cpu(broker.pid)
                written = micro_batches(broker.bootstrap, topic, batches, own)
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                broker_s = broker_cpu(broker.pid) - broker_s
                if written != 2 * n:
                    raise RuntimeError(f"wrote {written} rows of {2 * n}")
                print(f"| {run} | {label} | {cpu / written * 1e6:.2f} | {wall:.2f} | {broker_s:.2f} |", flush=True)
    sink.own_producer.supports = supports
    print(f"\n- 2 micro-batches of {n:,} records of {args.size} bytes, {PARTITIONS} tasks each; {os.cpu_count()} CPUs; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/spark_eos_write.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
