"""The log cleaner on one Ottla broker this script starts: how fast it cleans, and what it costs
produce latency on another topic while it runs.

A compacted topic `table` (segment.bytes 1 MiB) is filled with --records updates of --keys keys
(100-byte values, linger 5 ms, uncompressed unless --compression) while the cleaner is off.
Then, per scenario, the broker restarts and a confluent-kafka producer writes one 100-byte
record every 2 ms to another topic (acks=all, linger.ms=0) for --seconds, measuring each
record's delivery latency:

- "no cleaner": log.cleaner.enable=false; nothing is cleaned.
- "cleaner": the default cleaner (1 thread, no I/O limit) cleans `table` meanwhile.
- "cleaner, throttled": log.cleaner.io.max.bytes.per.second=--throttle-mb MB/s.

Cleaner throughput is what the broker logs per pass (bytes read from the segments it cleaned
over the pass's wall time, offset map building included). Each scenario starts from a copy
of the same filled data directory.

    .venv/bin/python benchmarks/cleaner.py                       # 300k records, 20 s per scenario
    .venv/bin/python benchmarks/cleaner.py --records 50000 --seconds 5

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, progress  # noqa: E402

_PASS = re.compile(r"cleaned table-0 up to offset \d+: read ([\d.]+) MiB, wrote ([\d.]+) MiB, kept (\d+) of (\d+) "
                   r"records in ([\d.]+) s")


def fill(bootstrap: str, records: int, keys: int, compression: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([
        NewTopic("table", 1, 1, config={"cleanup.policy": "compact", "segment.bytes": str(1 << 20)}),
        NewTopic("other", 1, 1)])
    for future in futures.values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": compression})
    value = b"v" * 100
    for i in range(records):
        while True:
            try:
                producer.produce("table", key=b"key-%08d" % (i % keys), value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("fill did not finish")


def measure_latency(bootstrap: str, seconds: float) -> list[float]:
    """Delivery latency (ms) of one record every 2 ms to `other`."""
    latencies: list[float] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})

    def delivered(error, message, sent=None):
        if error is None:
            latencies.append((time.monotonic() - sent) * 1000)

    deadline = time.monotonic() + seconds
    next_send = time.monotonic()
    while time.monotonic() < deadline:
        sent = time.monotonic()
        producer.produce("other", value=b"x" * 100, partition=0,
                         on_delivery=lambda err, msg, sent=sent: delivered(err, msg, sent))
        next_send += 0.002
        producer.poll(max(0.0, next_send - time.monotonic()))
    producer.flush(30)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_scenario(children: Children, template: Path, root: Path, name: str, config: dict[str, str],
                 seconds: float) -> dict:
    data_dir = root / name.replace(" ", "-").replace(",", "")
    shutil.copytree(template, data_dir)
    args = ["--log-level", "info"]
    for key, value in {"log.cleaner.backoff.ms": "200", **config}.items():
        args += ["--config", f"{key}={value}"]
    broker = Ottla(children, data_dir, args)
    broker.start()
    progress(f"{name}: measuring produce latency for {seconds:g}s")
    latencies = measure_latency(broker.bootstrap, seconds)
    broker.stop()
    passes = [m.groups() for m in map(_PASS.search, broker.log_lines()) if m]
    read_mib = sum(float(p[0]) for p in passes)
    elapsed = sum(float(p[4]) for p in passes)
    return {"name": name, "p50": statistics.median(latencies), "p99": percentile(latencies, 0.99),
            "max": max(latencies), "count": len(latencies), "passes": len(passes), "read_mib": read_mib,
            "written_mib": sum(float(p[1]) for p in passes), "kept": sum(int(p[2]) for p in passes),
            "read_records": sum(int(p[3]) for p in passes), "clean_s": elapsed,
            "mib_s": read_mib / elapsed if elapsed else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--throttle-mb", type=float, default=2.0)
    parser.add_argument("--compression", default="none")
    args = parser.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-cleaner-bench-") as tmp:
        root = Path(tmp)
        template = root / "template"
        filler = Ottla(children, template, ["--config", "log.cleaner.enable=false"])
        filler.start()
        progress(f"filling table with {args.records:,} updates of {args.keys:,} keys")
        fill(filler.bootstrap, args.records, args.keys, args.compression)
        filler.stop()
        size = sum(p.stat().st_size for p in (template / "table-0").glob("*.log"))
        results = [
            run_scenario(children, template, root, "no cleaner", {"log.cleaner.enable": "false"}, args.seconds),
            run_scenario(children, template, root, "cleaner", {}, args.seconds),
            run_scenario(children, template, root, "cleaner, throttled",
                         {"log.cleaner.io.max.bytes.per.second": str(int(args.throttle_mb * 1e6))}, args.seconds),
        ]
    print("| scenario | produce p50 ms | produce p99 ms | max ms | records | cleaner passes | MiB read | "
          "MiB written | records kept/read | cleaning s | cleaner MiB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        mib_s = f"{r['mib_s']:.1f}" if r["mib_s"] else "-"
        print(f"| {r['name']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.0f} | {r['count']:,} | {r['passes']} | "
              f"{r['read_mib']:.1f} | {r['written_mib']:.1f} | {r['kept']:,}/{r['read_records']:,} | "
              f"{r['clean_s']:.1f} | {mib_s} |")
    print()
    print(f"- table: {args.records:,} updates of {args.keys:,} keys, {size / 2**20:.1f} MiB in 1 MiB segments, "
          f"compression {args.compression}; throttled scenario at {args.throttle_mb:g} MB/s")
    print(f"- {os.cpu_count()} CPUs; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"run took {time.monotonic() - started:.0f}s")
    print(f"- command: python benchmarks/cleaner.py --records {args.records} --keys {args.keys} "
          f"--seconds {args.seconds:g} --throttle-mb {args.throttle_mb:g} --compression {args.compression}")


if __name__ == "__main__":
    main()
