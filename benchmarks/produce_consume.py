"""Produce/consume throughput of Ottla, measured against librdkafka's in-memory mock cluster.

Every case runs, in the same invocation and with the same load generator, against the mock
cluster (the yardstick: a broker that does no real work) and against Ottla, so the ratio
between the two says more than either number alone and is comparable across machines.

Cases: 100-byte and 1 KiB values x acks=1 and acks=all. Load generators: the confluent-kafka
Python client and kcat. The producer and the consumer are each their own process. Per case:

1. create a topic (``--partitions``) per acks setting on both targets;
2. produce N records (a producer process per run), check the high watermarks add up;
3. consume C records of the first topic from the beginning (a consumer process per run),
   where C is the smaller of N and what the mock still holds -- it keeps only ~5 MiB per
   partition -- so both targets serve the same volume.

Each measurement is repeated ``--repeat`` times, alternating targets; the median is reported.

Rates are records (and value bytes, MB = 10^6 bytes) divided by the producer's or consumer's
own elapsed time: for kcat the process wall time, for the Python client the time from creating
the client to flush()/the last record (interpreter start-up excluded).

    .venv/bin/python benchmarks/produce_consume.py            # quick, < 1 minute
    .venv/bin/python benchmarks/produce_consume.py --full     # a few minutes
    .venv/bin/python benchmarks/produce_consume.py --bootstrap 127.0.0.1:9092   # running broker

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import confluent_kafka
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Mock, Ottla, produce_blocking, progress, rss_mib  # noqa: E402

# Records per case and repetitions (the median is reported).
PRESETS = {
    "quick": {100: 400_000, 1024: 80_000, "repeat": 1},
    "full": {100: 3_000_000, 1024: 500_000, "repeat": 3},
}
TARGET_RATIO = 0.60
VALUE_POOL = 1024  # distinct values the Python producer cycles through


@dataclass
class Target:
    name: str
    bootstrap: str
    create_topic: Callable[[str, int], None]
    pid: int | None = None


@dataclass
class Result:
    phase: str
    size: int
    acks: str
    generator: str
    target: str
    records: int
    seconds: list[float]  # one per repetition

    @property
    def records_per_s(self) -> float:
        return self.records / statistics.median(self.seconds)

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.size / 1e6


# -- load generator processes -------------------------------------------------------------------


def _values(size: int) -> list[bytes]:
    rng = random.Random(size)
    alphabet = (string.ascii_letters + string.digits).encode()
    return [bytes(rng.choices(alphabet, k=size)) for _ in range(VALUE_POOL)]


def role_python_produce(args: argparse.Namespace) -> dict:
    values = _values(args.size)
    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": args.acks, "log_level": 0})
    for i in range(args.records):
        value = values[i % VALUE_POOL]
        produce_blocking(producer, args.topic, value)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - started
    if left:
        raise SystemExit(f"{left} records still undelivered after flush")
    return {"seconds": seconds}


def role_python_consume(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{args.topic}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign(
        [TopicPartition(args.topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(args.partitions)]
    )
    count = 0
    last_progress = time.monotonic()
    while count < args.records:
        batch = consumer.consume(10_000, timeout=1)
        for message in batch:
            if message.error():
                raise SystemExit(f"consume error: {message.error()}")
        if batch:
            count += len(batch)
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > 30:
            raise SystemExit(f"stalled after {count} of {args.records} records")
    seconds = time.perf_counter() - started
    consumer.close()
    return {"seconds": seconds, "records": count}


def _run_role(children: Children, role: str, **params: object) -> dict:
    args = [sys.executable, __file__, "--role", role]
    for key, value in params.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return children.run_json(args, role)


def _kcat_produce(children: Children, target: Target, topic: str, acks: str, data: Path) -> float:
    args = ["kcat", "-P", "-q", "-b", target.bootstrap, "-t", topic, "-X", f"acks={acks}", "-l", str(data)]
    started = time.perf_counter()
    proc = children.spawn(args)
    proc.wait()
    seconds = time.perf_counter() - started
    children.procs.remove(proc)
    if proc.returncode:
        raise RuntimeError(f"kcat producer failed with code {proc.returncode} (its own message is above)")
    return seconds


def _kcat_consume(children: Children, target: Target, topic: str, records: int) -> tuple[float, int]:
    # One newline per record is enough to count them without paying for the payload twice.
    args = ["kcat", "-C", "-q", "-b", target.bootstrap, "-t", topic, "-o", "beginning", "-e",
            "-c", str(records), "-f", "\\n"]
    started = time.perf_counter()
    proc = children.spawn(args, stdout=subprocess.PIPE)
    count = 0
    while chunk := proc.stdout.read(1 << 16):
        count += chunk.count(b"\n")
    proc.wait()
    seconds = time.perf_counter() - started
    children.procs.remove(proc)
    if proc.returncode:
        raise RuntimeError(f"kcat consumer failed with code {proc.returncode} (its own message is above)")
    return seconds, count


# -- orchestration ------------------------------------------------------------------------------


def _watermarks(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """(records written, records still held) over all partitions."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks", "log_level": 0})
    try:
        written = held = 0
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            written += high
            held += high - low
        return written, held
    finally:
        consumer.close()


def _admin_create_topic(bootstrap: str) -> Callable[[str, int], None]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})

    def create(topic: str, partitions: int) -> None:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
        deadline = time.monotonic() + 30
        while True:  # wait until every partition has a leader
            meta = admin.list_topics(topic, timeout=10).topics[topic]
            if meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} not ready")
            time.sleep(0.1)

    return create


def _data_file(workdir: Path, size: int, records: int) -> Path:
    """Newline-separated values for kcat, written once per size and count."""
    path = workdir / f"values-{size}-{records}.txt"
    if not path.exists():
        values = _values(size)
        with open(path, "wb") as out:
            for start in range(0, records, VALUE_POOL):
                out.write(b"\n".join(values[: min(VALUE_POOL, records - start)]) + b"\n")
        os.sync()  # so write-back does not compete with the first timed run
    return path


def run_size(
    children: Children, targets: list[Target], workdir: Path, args: argparse.Namespace,
    size: int, acks_list: list[str], generator: str,
) -> list[Result]:
    """Produce once per acks setting, then consume the first topic: the bytes a consumer
    reads do not depend on the acks they were written with. Repeats alternate between the
    targets so that drifts in machine load hit both alike."""
    records = args.records_100 if size == 100 else args.records_1k
    data = _data_file(workdir, size, records) if generator == "kcat" else None
    results = []
    held: dict[str, int] = {}
    first_topic = None
    for acks in acks_list:
        topic = f"bench-{size}-{acks}-{generator}-{uuid.uuid4().hex[:6]}"
        first_topic = first_topic or topic
        timings = {target.name: Result("produce", size, acks, generator, target.name, records, [])
                   for target in targets}
        for target in targets:
            target.create_topic(topic, args.partitions)
        for rep in range(args.repeat):
            for target in targets:
                progress(f"{size}B acks={acks} {generator}: producing {records:,} records to {target.name}"
                         f" ({rep + 1}/{args.repeat})")
                if generator == "kcat":
                    seconds = _kcat_produce(children, target, topic, acks, data)
                else:
                    seconds = _run_role(children, "python-produce", bootstrap=target.bootstrap,
                                        topic=topic, records=records, size=size, acks=acks)["seconds"]
                timings[target.name].seconds.append(seconds)
                written, still_held = _watermarks(target.bootstrap, topic, args.partitions)
                if written != records * (rep + 1):
                    raise RuntimeError(f"{target.name}: high watermarks add up to {written:,},"
                                       f" expected {records * (rep + 1):,}")
                if topic == first_topic:
                    held[target.name] = still_held
        results += timings.values()

    # The mock may have dropped old batches; read only what every target still holds.
    to_read = min([records, *held.values()])
    timings = {target.name: Result("consume", size, "", generator, target.name, to_read, [])
               for target in targets}
    for rep in range(args.repeat):
        for target in targets:
            progress(f"{size}B {generator}: consuming {to_read:,} records from {target.name}"
                     f" ({rep + 1}/{args.repeat})")
            if generator == "kcat":
                seconds, count = _kcat_consume(children, target, first_topic, to_read)
            else:
                out = _run_role(children, "python-consume", bootstrap=target.bootstrap, topic=first_topic,
                                records=to_read, partitions=args.partitions)
                seconds, count = out["seconds"], out["records"]
            if count < to_read:
                raise RuntimeError(f"{target.name}: consumed {count:,} of {to_read:,} records")
            timings[target.name].seconds.append(seconds)
    return results + list(timings.values())


def render(results: list[Result], mock_name: str) -> str:
    baseline = {(r.phase, r.size, r.acks, r.generator): r for r in results if r.target == mock_name}
    lines = [
        "| phase | case | generator | target | records | records/s | MB/s | ottla/mock |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = ""
        if r.target != mock_name:
            value = r.records_per_s / baseline[(r.phase, r.size, r.acks, r.generator)].records_per_s
            ratio = f"{value:.2f}" + ("" if value >= TARGET_RATIO else f" (< {TARGET_RATIO:.2f})")
        case = "1 KiB" if r.size == 1024 else f"{r.size} B"
        case += f" acks={r.acks}" if r.acks else ""
        lines.append(
            f"| {r.phase} | {case} | {r.generator} | {r.target} | {r.records:,} | "
            f"{r.records_per_s:,.0f} | {r.mb_per_s:,.1f} | {ratio} |"
        )
    return "\n".join(lines)


def _parse_cases(text: str) -> list[tuple[int, str]]:
    cases = []
    for item in text.split(","):
        size, _, acks = item.partition(":")
        if int(size) not in (100, 1024) or acks not in ("1", "all"):
            raise argparse.ArgumentTypeError(f"bad case {item!r}; use SIZE:ACKS with SIZE 100|1024, ACKS 1|all")
        cases.append((int(size), acks))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="larger record counts (a few minutes)")
    parser.add_argument("--records-100", type=int, help="records per 100-byte case")
    parser.add_argument("--records-1k", type=int, help="records per 1 KiB case")
    parser.add_argument("--repeat", type=int, help="runs per measurement; the median is reported")
    parser.add_argument("--partitions", type=int, default=32,
                        help="partitions per topic; the mock holds ~5 MiB each, which caps the consume volume")
    parser.add_argument("--cases", type=_parse_cases, default=_parse_cases("100:1,100:all,1024:1,1024:all"))
    parser.add_argument("--generators", default="python,kcat", help="comma-separated: python, kcat")
    parser.add_argument("--bootstrap", help="benchmark this running broker instead of starting `ottla serve`")
    parser.add_argument("--ottla-arg", action="append", default=[],
                        help="extra argument for `ottla serve` (repeatable)")
    parser.add_argument("--mock-as-ottla", action="store_true",
                        help="stand a second mock cluster in for Ottla (to test this script)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    # Internal: the same script is the producer/consumer process.
    parser.add_argument("--role", choices=["python-produce", "python-consume"], help=argparse.SUPPRESS)
    for name, kind in (("topic", str), ("records", int), ("size", int), ("acks", str)):
        parser.add_argument(f"--{name}", type=kind, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role:
        handler = role_python_produce if args.role == "python-produce" else role_python_consume
        print(json.dumps(handler(args)))
        return

    preset = PRESETS["full" if args.full else "quick"]
    args.records_100 = args.records_100 or preset[100]
    args.records_1k = args.records_1k or preset[1024]
    args.repeat = args.repeat or preset["repeat"]
    generators = args.generators.split(",")
    if set(generators) - {"python", "kcat"}:
        parser.error(f"unknown generator in {args.generators!r}; use python, kcat")
    if "kcat" in generators and shutil.which("kcat") is None:
        parser.error("kcat not found (scripts/install-system-deps.sh installs it), or use --generators python")

    results: list[Result] = []
    ottla = None
    # Children are stopped before their temp dir goes away.
    with tempfile.TemporaryDirectory(prefix="ottla-bench-") as tmp, Children() as children:
        workdir = Path(tmp)
        mock = Mock(children)
        targets = [Target("mock", mock.bootstrap, mock.create_topic, mock.proc.pid)]
        if args.mock_as_ottla:
            other = Mock(children)
            targets.append(Target("ottla(mock)", other.bootstrap, other.create_topic, other.proc.pid))
        elif args.bootstrap:
            targets.append(Target("ottla", args.bootstrap, _admin_create_topic(args.bootstrap)))
        else:
            ottla = Ottla(children, workdir / "ottla-data", args.ottla_arg)
            progress(f"starting ottla on {ottla.bootstrap}")
            ottla.start()
            targets.append(Target("ottla", ottla.bootstrap, _admin_create_topic(ottla.bootstrap), ottla.proc.pid))
        progress("targets: " + ", ".join(f"{t.name} at {t.bootstrap}" for t in targets))

        load_before = os.getloadavg()[0]
        started = time.monotonic()
        try:
            for size in dict.fromkeys(size for size, _ in args.cases):
                acks_list = [acks for s, acks in args.cases if s == size]
                for generator in generators:
                    results += run_size(children, targets, workdir, args, size, acks_list, generator)
        except Exception:
            if ottla is not None:
                state = "running" if ottla.proc.poll() is None else f"exited with code {ottla.proc.returncode}"
                progress(f"ottla is {state}; its log ends:\n{ottla.log_tail()}")
            raise
        elapsed = time.monotonic() - started
        broker_rss = {t.name: rss_mib(t.pid) for t in targets if t.pid is not None}
        # Warnings (e.g. connections closed on a request Ottla could not parse) mean clients
        # reconnected and retried during the run, which the rates alone would hide.
        complaints = [line for line in (ottla.log_lines() if ottla else [])
                      if "WARNING" in line or "ERROR" in line]

    print(render(results, "mock"))
    print()
    for name, (rss, peak) in broker_rss.items():
        print(f"- RSS of {name} after the run: {rss:.0f} MiB (peak {peak:.0f} MiB)")
    print(f"- {os.cpu_count()} CPUs; confluent-kafka {confluent_kafka.__version__} "
          f"(librdkafka {confluent_kafka.libversion()[0]}); {_kcat_version()}; run took {elapsed:.0f}s")
    print(f"- {args.partitions} partitions per topic; median of {args.repeat} run(s) per row; load average"
          f" {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other work on the machine skews results)")
    if complaints:
        print(f"- ottla logged {len(complaints)} warnings/errors during the run, e.g.:")
        print("".join(f"  - `{line.strip()[:300]}`\n" for line in complaints[:3]), end="")
    print(f"- command: {shlex.join(['python', 'benchmarks/produce_consume.py', *sys.argv[1:]])}")
    if args.json:
        args.json.write_text(json.dumps(
            {"results": [asdict(r) for r in results], "rss_mib": broker_rss}, indent=2))


def _kcat_version() -> str:
    if shutil.which("kcat") is None:
        return "no kcat"
    out = subprocess.run(["kcat", "-V"], capture_output=True, text=True).stdout
    found = re.search(r"Version (\S+).*librdkafka (\S+)", out)
    return f"kcat {found[1]} (librdkafka {found[2]})" if found else "kcat"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        progress("interrupted")
        sys.exit(130)
