"""One log cleaner pass in-process: the CPU cost of the cleaning code itself.

benchmarks/cleaner.py times passes in the broker's niced worker process, which on a busy
machine mostly measures how much CPU the worker got. This fills a compacted log (1 MiB
segments, --records updates of --keys keys, --per-batch records per batch, 100-byte values,
uncompressed unless --compression) through `Log.append`, then runs `clean()` on a copy of it
--trials times, unthrottled, and reports the best CPU time and MiB/s of segments cleaned.

    PYTHONPATH=src .venv/bin/python benchmarks/cleaner_pass.py --records 200000 --keys 10000

Results table (Markdown) on stdout; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from ottla.config import BrokerConfig
from ottla.log import LogManager
from ottla.log.cleaner.clean import Throttler, clean
from ottla.log.cleaner.filter import OffsetMap
from ottla.log.cleaner.service import LogCleaner
from ottla.records.records import Record, build_batch

NOW = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def fill(data_dir: Path, records: int, keys: int, per_batch: int, codec: int) -> None:
    manager = LogManager(data_dir, BrokerConfig({}), clock=lambda: NOW)
    manager.create_topic("table", 1, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
    log = manager.get_log("table", 0)
    value = b"v" * 100
    for start in range(0, records, per_batch):
        batch = [Record(b"key-%08d" % (i % keys), value, (), NOW) for i in range(start, min(records, start + per_batch))]
        log.append(build_batch(batch, now_ms=NOW, compression=codec), now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    manager.close()


def one_pass(data_dir: Path) -> tuple[float, float, int, int, int]:
    """(CPU s, wall s, bytes of segments read, records read, records kept) of one clean."""
    manager = LogManager(data_dir, BrokerConfig({}), clock=lambda: NOW)
    log = manager.get_log("table", 0)
    cleaner = LogCleaner(manager, manager.broker_config, clock=lambda: NOW)
    stats = cleaner.dirty_stats(("table", 0), log, NOW)
    task = cleaner._task(log, stats, NOW)
    cpu, wall = time.process_time(), time.perf_counter()
    result = clean(task, OffsetMap(128 << 20), Throttler(float("inf")), lambda: None)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    for group in result.groups:  # leave the directory as it was for the next trial
        for path in data_dir.glob(f"table-0/{group.base:020d}.*.cleaned"):
            path.unlink()
    manager.close()
    return cpu, wall, result.bytes_read, result.records_read, result.records_kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=50)
    parser.add_argument("--compression", choices=sorted(CODECS), default="none")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ottla-cleaner-pass-") as tmp:
        template = Path(tmp) / "template"
        fill(template, args.records, args.keys, args.per_batch, CODECS[args.compression])
        trials = []
        for _ in range(args.trials):
            copy = Path(tmp) / "trial"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(template, copy)
            trials.append(one_pass(copy))
    cpu = min(t[0] for t in trials)
    wall = min(t[1] for t in trials)
    read, records_read, kept = trials[0][2:]
    print("| records | keys | per batch | codec | MiB read | records kept/read | pass CPU s | pass wall s "
          "| MiB/s (CPU) |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    print(f"| {args.records:,} | {args.keys:,} | {args.per_batch} | {args.compression} | {read / 2**20:.1f} | "
          f"{kept:,}/{records_read:,} | {cpu:.2f} | {wall:.2f} | {read / 2**20 / cpu:.1f} |")
    print()
    print(f"- best of {args.trials} passes; {os.cpu_count()} CPUs; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/cleaner_pass.py --records {args.records} --keys {args.keys} "
          f"--per-batch {args.per_batch} --compression {args.compression} --trials {args.trials}")


if __name__ == "__main__":
    main()
