"""What an exactly-once write task costs beyond an at-least-once one, per task, in this process without Spark
(issue 16): the requests it sends by API, its CPU and wall time, and the broker's CPU (user and system).

    .venv/bin/python benchmarks/spark_eos_tasks.py                  # 200 tasks of 100 rows per mode, 3 rounds
    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/spark_eos_tasks.py --rows 10000

One broker (`ottla serve`), a topic of 4 partitions; each task is `StreamWriter.write` as a Spark Python worker
calls it (under a stand-in for Spark's TaskContext) over one Arrow batch of `--rows` rows, through Ottla's own
producers. Modes, alternated round by round:

- `at-least-once`: the worker's kept idempotent producer (Produce only);
- `exactly-once, kept`: micro-batch after micro-batch of partitions 0-3, each task with the producer its
  partition's previous task kept (the transaction: AddOffsetsToTxn, TxnOffsetCommit, AddPartitionsToTxn,
  Produce, EndTxn);
- `exactly-once, new`: each micro-batch a new query, so each task a new producer (its connection, the
  coordinators, InitProducerId, the marker read, then the transaction), as in a query's first micro-batch.

Small tasks show the fixed cost; Spark's own share (the JVM, the Arrow exchange) is not here.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic
from spark_workers import PARTITIONS, TaskContext, spark_batches

import ottla.testing
from ottla import admin_client
from ottla.protocol.schemas import api_name
from ottla.spark import sink
from ottla.spark.options import parse_write_options

MODES = ("at-least-once", "exactly-once, kept", "exactly-once, new")
_TICKS = os.sysconf("SC_CLK_TCK")


def _count_requests() -> collections.Counter:
    """Every request this process sends through the own clients, by API name (each still sent)."""
    sent: collections.Counter = collections.Counter()
    submit = admin_client.BrokerConnection.submit

    def counted(self, api_key, version, body):
        sent[api_name(api_key)] += 1
        return submit(self, api_key, version, body)

    admin_client.BrokerConnection.submit = counted
    return sent


def _broker_cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def tasks(bootstrap: str, topic: str, mode: str, count: int, rows: list, first_batch: int) -> None:
    """`count` tasks, micro-batches from `first_batch` on: of one query (whose producers the "worker" keeps from
    round to round) or, for `exactly-once, new`, each of a new query."""
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": topic, "deliveryGuarantee":
                                   "at_least_once" if mode == "at-least-once" else "exactly_once"}, streaming=True)
    for i in range(count):
        batch, partition = divmod(i, PARTITIONS)
        if mode == "exactly-once, new":
            TaskContext.current = TaskContext(0, partition, f"new-{first_batch + batch}")
        else:
            TaskContext.current = TaskContext(first_batch + batch, partition, "kept")
        sink.StreamWriter(options).write(iter(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks per mode and round")
    parser.add_argument("--rows", type=int, default=100, help="rows per task (100-byte values)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = spark_batches(args.rows, 100)
    sink.TaskContext = TaskContext
    sent = _count_requests()
    results = collections.defaultdict(list)
    requests = {}
    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("out", PARTITIONS, 1)])["out"].result(30)
        for mode in MODES:  # warm-up: imports, the kept at-least-once producer, the coordinators' first loads
            tasks(broker.bootstrap, "out", mode, 2 * PARTITIONS, rows, 0)
        for run in range(args.rounds):
            for mode in MODES:
                sent.clear()
                cpu, wall, (user, system) = time.process_time(), time.monotonic(), _broker_cpu(broker.pid)
                tasks(broker.bootstrap, "out", mode, args.tasks, rows, 2 + run * args.tasks)
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                end_user, end_system = _broker_cpu(broker.pid)
                results[mode].append((cpu, wall, end_user - user, end_system - system))
                requests[mode] = dict(sent)
    for task in sink._TRANSACTIONAL.values():
        task.close()

    print("| mode | requests per task | client CPU ms | wall ms | broker CPU ms (system) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for mode in MODES:
        per = [[value * 1000 / args.tasks for value in result] for result in results[mode]]
        asked = ", ".join(f"{name} {n / args.tasks:g}" for name, n in requests[mode].items())
        cpu, wall, user, system = (statistics.median(column) for column in zip(*per))
        print(f"| {mode} | {asked} | {cpu:.2f} | {wall:.2f} | {user + system:.2f} ({system:.2f}) |")
    print(f"\n- per task, median of {args.rounds} rounds of {args.tasks} tasks of {args.rows} rows; {os.cpu_count()} CPUs; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/spark_eos_tasks.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
