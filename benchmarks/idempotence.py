"""What idempotence costs on the produce path: the same librdkafka producer with and without
`enable.idempotence`, against one Ottla broker this script starts.

Both modes use identical settings -- acks=all, max.in.flight.requests.per.connection=5 (the
idempotent limit), 100-byte values, the same batching (librdkafka's default unless
`--batch-records` says otherwise) -- so the only difference
is the producer id and sequence numbers in each batch and the broker's checks on them. Each
run writes to a fresh topic from its own producer process; runs alternate between the modes
so drifts in machine load hit both alike, and the median of the repeats is reported. After
every run the high watermarks must add up to the records sent, and for idempotent runs every
partition must show exactly one producer in DescribeProducers (proof the mode was on).

A run's rate is records divided by the time from the first produce() to flush() returning,
after one warm-up record has been acknowledged: librdkafka's idempotent producer spends its
first 0.5-1 s on its own PID state machine (it polls for a usable broker every 500 ms before
sending InitProducerId), a fixed start-up cost reported separately as "first ack". Broker CPU
is the broker process's user+system time during the whole run, producer CPU the producer
process's (all threads) during the timed part: on a busy machine CPU time is steadier than rates.

    .venv/bin/python benchmarks/idempotence.py                  # 500k records x 5 repeats, ~1 min
    .venv/bin/python benchmarks/idempotence.py --records 200000 --repeat 3

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, progress  # noqa: E402

MODES = {"idempotent": True, "non-idempotent": False}
VALUE_SIZE = 100
TARGET = 0.95  # the goal: idempotent throughput within 5% of non-idempotent
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def role_produce(args: argparse.Namespace) -> None:
    """The load generator, in its own process so it does not share a core's GIL with us."""
    rng = random.Random(0)
    values = [bytes(rng.getrandbits(8) for _ in range(VALUE_SIZE)) for _ in range(1024)]
    created = time.perf_counter()
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "enable.idempotence": args.idempotent,
        "max.in.flight.requests.per.connection": 5,
        "batch.num.messages": args.batch_records,
        "log_level": 0,
    })
    producer.produce(args.topic, values[0])
    if producer.flush(60):
        raise SystemExit("warm-up record unacknowledged after 60 s")
    started = time.perf_counter()
    cpu_started = _own_cpu_seconds()
    for i in range(args.records):
        while True:
            try:
                producer.produce(args.topic, values[i % 1024])
                break
            except BufferError:  # local queue full: let librdkafka send
                producer.poll(0.005)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    seconds = time.perf_counter() - started
    cpu = _own_cpu_seconds() - cpu_started
    if left:
        raise SystemExit(f"{left} records still unacknowledged after flush")
    print(json.dumps({"seconds": seconds, "first_ack": started - created, "producer_cpu": cpu}))


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads, librdkafka's included
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def _records_written(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-check", "log_level": 0})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def _producers_per_partition(bootstrap: str, topic: str) -> list[int]:
    from ottla.admin_client import AdminProtocolClient

    with AdminProtocolClient(bootstrap) as client:
        return [len(states) for states in client.describe_producers(topic).values()]


def _run(children: Children, broker: Ottla, admin: AdminClient, args: argparse.Namespace, mode: str) -> dict:
    topic = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
    command = [sys.executable, __file__, "--role", "produce", "--bootstrap", broker.bootstrap, "--topic", topic,
               "--records", str(args.records), "--batch-records", str(args.batch_records)]
    if MODES[mode]:
        command.append("--idempotent")
    cpu_before = _cpu_seconds(broker.proc.pid)
    proc = children.spawn(command, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    children.procs.remove(proc)
    cpu = _cpu_seconds(broker.proc.pid) - cpu_before
    if proc.returncode:
        raise RuntimeError(f"producer process failed with code {proc.returncode}")
    written = _records_written(broker.bootstrap, topic, args.partitions)
    if written != args.records + 1:  # and the warm-up record
        raise RuntimeError(f"{mode}: {written} records in the log, {args.records + 1} sent")
    producers = _producers_per_partition(broker.bootstrap, topic)
    expected = [1 if MODES[mode] else 0] * args.partitions
    if producers != expected:
        raise RuntimeError(f"{mode}: active producers per partition {producers}, expected {expected}")
    return {**json.loads(out.strip().splitlines()[-1]), "broker_cpu": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-records", type=int, default=10_000,
                        help="librdkafka batch.num.messages (default: librdkafka's own, 10000)")
    parser.add_argument("--role", choices=["produce"], help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--idempotent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "produce":
        role_produce(args)
        return 0

    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-bench-idem-") as workdir:
        broker = Ottla(children, Path(workdir) / "data")
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        samples: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for rep in range(args.repeat):
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
            for mode in order:
                result = _run(children, broker, admin, args, mode)
                samples[mode].append(result)
                progress(f"run {rep + 1}/{args.repeat} {mode}: {args.records / result['seconds']:,.0f} records/s, "
                         f"broker CPU {result['broker_cpu']:.2f} s")
        broker.stop()

    rates = {mode: args.records / statistics.median(r["seconds"] for r in runs) for mode, runs in samples.items()}
    print(f"{args.records:,} records of {VALUE_SIZE} bytes, {args.partitions} partitions, acks=all, "
          f"max.in.flight=5, batch.num.messages={args.batch_records}, median of {args.repeat} runs each\n")
    print("| mode | records/s | MB/s (values) | runs (records/s) | broker CPU (s) | producer CPU (s) | first ack (s) |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for mode, runs in samples.items():
        each = sorted(args.records / r["seconds"] for r in runs)
        median = {key: statistics.median(r[key] for r in runs) for key in ("broker_cpu", "producer_cpu", "first_ack")}
        print(f"| {mode} | {rates[mode]:,.0f} | {rates[mode] * VALUE_SIZE / 1e6:.1f} | "
              f"{each[0]:,.0f} - {each[-1]:,.0f} | {median['broker_cpu']:.2f} | {median['producer_cpu']:.2f} | "
              f"{median['first_ack']:.2f} |")
    ratio = rates["idempotent"] / rates["non-idempotent"]
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"\nidempotent / non-idempotent = {ratio:.3f} ({verdict} the >= {TARGET:.2f} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
