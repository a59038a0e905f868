"""What transactions cost on the produce path: a transactional producer committing every 100 ms
and every 1 s against the same producer in plain idempotent mode, on one Ottla broker this
script starts.

All modes use identical producer settings (confluent-kafka, acks=all, idempotence, default
batching, 100-byte values unless --value-size says otherwise); the transactional modes add the transactional id and call
commit_transaction() whenever the current transaction is older than the interval, then begin
the next one. Each run is its own producer process writing a fresh topic; modes alternate
between repeats so drifts in machine load hit all of them alike. "vs idempotent" is the median
over repeats of each repeat's rate divided by the idempotent rate of the same repeat (runs
minutes apart on a shared 2-core machine differ by more than the effect measured here).
A run's rate is records divided by the time from the first record to the last
acknowledgement (idempotent: the final flush; transactional: the last commit), after a
warm-up (one acknowledged record, or one committed transaction) that takes librdkafka's
producer-id start-up out of the measurement. Commit latency is the time commit_transaction()
took, and the part of it after the transaction's records were acknowledged (EndTxn), over
every commit of every repeat; "in commits" is the share of the runs' time the producer spent
blocked in commit_transaction(). Broker CPU is the broker process's user+system time during a
run; on a busy machine it is steadier than rates. With --mock the same runs also go to
librdkafka's in-memory mock cluster, a broker that does no work: its ratios are what the
client alone loses by committing, which no broker can win back. After each run the high watermarks must
account for the records sent and, for transactions, the last stable offset must reach the
high watermark.

    .venv/bin/python benchmarks/transactions.py                       # 3M records x 3 repeats, ~2 min
    .venv/bin/python benchmarks/transactions.py --records 100000 --repeat 1
    .venv/bin/python benchmarks/transactions.py --repeat 5 --mock    # also the mock-cluster yardstick

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import IsolationLevel, Producer, TopicPartition, libversion
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from ottla.end_offsets import list_offsets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Mock, Ottla, cpu_seconds, produce_blocking, progress  # noqa: E402

TARGET = 0.90  # the goal: transactional throughput at 100 ms commits >= 90% of idempotent
MODES = {"idempotent": None, "txn-1s": 1.0, "txn-100ms": 0.1}  # commit interval in seconds


def _values(size: int) -> list[bytes]:
    rng = random.Random(0)
    return [rng.randbytes(size) for _ in range(1024)]


def _commit(producer: Producer, timeout: float) -> tuple[float, float]:
    """(seconds in commit_transaction(), seconds of it after the records were acknowledged).

    commit_transaction() first waits for every record of the transaction, then sends EndTxn;
    flushing first splits the two without changing what the broker sees."""
    started = time.perf_counter()
    if producer.flush(timeout):
        raise SystemExit("records still unacknowledged before commit")
    flushed = time.perf_counter()
    producer.commit_transaction(timeout)
    done = time.perf_counter()
    return done - started, done - flushed


def role_producer(args: argparse.Namespace) -> dict:
    interval = MODES[args.mode]
    config = {"bootstrap.servers": args.bootstrap, "acks": "all", "enable.idempotence": True, "log_level": 0}
    if interval is not None:
        config["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    values = _values(args.value_size)
    if interval is None:
        producer.produce(args.topic, values[0])
        if producer.flush(60):
            raise SystemExit("warm-up record unacknowledged after 60 s")
    else:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce(args.topic, values[0])
        producer.commit_transaction(60)
        producer.begin_transaction()
    commits = []
    started = time.perf_counter()
    txn_started = started
    for i in range(args.records):
        produce_blocking(producer, args.topic, values[i % 1024])
        if i % 256 == 0:
            producer.poll(0)
            if interval is not None and time.perf_counter() - txn_started >= interval:
                commits.append(_commit(producer, 60))
                producer.begin_transaction()
                txn_started = time.perf_counter()
    if interval is None:
        if producer.flush(300):
            raise SystemExit("records still unacknowledged after flush")
    else:
        commits.append(_commit(producer, 300))
    return {"seconds": time.perf_counter() - started, "records": args.records + 1, "commits": commits}


def _end_offsets(admin: AdminClient, topic: str, partitions: int, isolation: IsolationLevel) -> int:
    answers = list_offsets(admin, {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
                           isolation_level=isolation, timeout_s=30)
    return sum(info.offset for info in answers.values())


def _check(admin: AdminClient, topic: str, partitions: int, mode: str, result: dict) -> None:
    """Every record is in the log, and every transaction got its markers (LSO reaches the HW;
    markers follow the commit answer by a moment, hence the short wait). The high watermark
    also counts the markers: at most one per partition per transaction, warm-up included."""
    high = _end_offsets(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
    most = result["records"]
    if MODES[mode] is not None:
        deadline = time.monotonic() + 30
        while _end_offsets(admin, topic, partitions, IsolationLevel.READ_COMMITTED) != high:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: last stable offset stuck below the high watermark")
            time.sleep(0.1)
            high = _end_offsets(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
        most += (len(result["commits"]) + 1) * partitions
    if not result["records"] <= high <= most:
        raise RuntimeError(f"{mode}: {high} offsets in the log for {result['records']} records sent")


class _Target:
    """Where a run's producer writes: Ottla (checked, broker CPU measured) or librdkafka's mock
    cluster, a broker that does no work -- what the client itself loses by committing."""

    def __init__(self, name: str, bootstrap: str, create_topic, pid: int | None = None,
                 admin: AdminClient | None = None):
        self.name, self.bootstrap, self.create_topic, self.pid, self.admin = name, bootstrap, create_topic, pid, admin


def _run(children: Children, target: _Target, mode: str, args: argparse.Namespace) -> dict:
    topic = f"bench-txn-{mode}-{uuid.uuid4().hex[:6]}"
    target.create_topic(topic, args.partitions)
    command = [sys.executable, __file__, "--role", "producer", "--mode", mode, "--bootstrap", target.bootstrap,
               "--topic", topic, "--records", str(args.records), "--value-size", str(args.value_size)]
    cpu_before = cpu_seconds(target.pid) if target.pid else 0.0
    result = children.run_json(command, f"{mode} producer")
    result["broker_cpu"] = cpu_seconds(target.pid) - cpu_before if target.pid else None
    if target.admin is not None:
        _check(target.admin, topic, args.partitions, mode, result)
    return result


def _paired_ratios(runs: list[dict], baseline: list[dict]) -> list[float]:
    """Each repeat's rate over the idempotent rate of the same repeat: the two ran back to
    back, so a drift in machine load between repeats cancels out of the ratio."""
    return [base["seconds"] / run["seconds"] for run, base in zip(runs, baseline)]


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--mock", action="store_true", help="also run against librdkafka's mock cluster")
    parser.add_argument("--role", choices=["producer"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        print(json.dumps(role_producer(args)))
        return 0

    load_before = os.getloadavg()
    samples: dict[tuple[str, str], list[dict]] = {}
    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-bench-txn-") as workdir:
        broker = Ottla(children, Path(workdir) / "data")
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})

        def create(topic: str, partitions: int) -> None:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)

        targets = [_Target("ottla", broker.bootstrap, create, broker.proc.pid, admin)]
        if args.mock:
            mock = Mock(children)
            targets.append(_Target("mock", mock.bootstrap, mock.create_topic))
        for rep in range(args.repeat):
            for target in targets:
                for mode in list(MODES) if rep % 2 == 0 else list(reversed(MODES)):
                    result = _run(children, target, mode, args)
                    samples.setdefault((target.name, mode), []).append(result)
                    progress(f"run {rep + 1}/{args.repeat} {target.name} {mode}: "
                             f"{args.records / result['seconds']:,.0f} records/s, {len(result['commits'])} commits")
        broker.stop()
    load_after = os.getloadavg()

    print(f"{args.records:,} records of {args.value_size} bytes, {args.partitions} partitions, acks=all, "
          f"librdkafka {libversion()[0]}, median of {args.repeat} runs each; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)\n")
    print("| broker | mode | records/s | vs idempotent | paired ratios | runs (records/s) | broker CPU (s) | commits "
          "| in commits | commit p50 (ms) | commit p99 (ms) | after flush p50 (ms) | after flush p99 (ms) |")
    print("| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rates = {key: args.records / statistics.median(r["seconds"] for r in runs) for key, runs in samples.items()}
    paired = {key: _paired_ratios(samples[key], samples[key[0], "idempotent"]) for key in samples}
    for (target, mode), runs in samples.items():
        each = sorted(args.records / r["seconds"] for r in runs)
        ratios = paired[target, mode]
        totals = [total for r in runs for total, _ in r["commits"]]
        end_txns = [end_txn for r in runs for _, end_txn in r["commits"]]
        latency = " | ".join(f"{_percentile(values, 0.5) * 1000:.1f} | {_percentile(values, 0.99) * 1000:.1f}"
                             if values else "- | -" for values in (totals, end_txns))
        cpu = "-" if runs[0]["broker_cpu"] is None else f"{statistics.median(r['broker_cpu'] for r in runs):.2f}"
        # The share of the run the producer spent blocked in commit_transaction().
        stalled = sum(totals) / sum(r["seconds"] for r in runs)
        print(f"| {target} | {mode} | {rates[target, mode]:,.0f} | {statistics.median(ratios):.3f} | "
              f"{min(ratios):.2f} - {max(ratios):.2f} | {each[0]:,.0f} - {each[-1]:,.0f} | {cpu} | {len(totals)} | "
              f"{stalled:.1%} | {latency} |")
    print()
    for target in dict.fromkeys(name for name, _ in samples):
        ratio = statistics.median(paired[target, "txn-100ms"])
        print(f"- {target}: txn-100ms / idempotent = {ratio:.3f}, median of {args.repeat} paired runs "
              f"({'meets' if ratio >= TARGET else 'misses'} the >= {TARGET:.2f} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
