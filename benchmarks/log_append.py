"""In-process cost of `Log.append`, the broker's per-batch write path, without sockets or clients.

Appends the same client batch (patched to a new base offset each time, as on the produce
path) to a fresh partition log, for a few batch sizes, and prints MB/s and microseconds per
batch. The log lives in a temporary directory, by default on /dev/shm, so the disk is not
what is measured; each trial's log is deleted before the next, so the page cache pages it
used are reused by the next trial.

    .venv/bin/python benchmarks/log_append.py
    .venv/bin/python benchmarks/log_append.py --dir /tmp --megabytes 512 --trials 7

Results table (Markdown) on stdout; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter

from ottla.config import BrokerConfig, TopicConfig
from ottla.log.log import Log
from ottla.records.records import Record, build_batch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import progress  # noqa: E402


def _batch(records: int, value_size: int, compression: str | None = None, keys: bool = False) -> bytes:
    values = [os.urandom(value_size) for _ in range(min(records, 64))]
    return build_batch([Record(b"%07d" % i if keys else None, values[i % len(values)], (), 1_000)
                        for i in range(records)], compression=compression)


def _trial(directory: str, batch: bytes, count: int) -> float:
    workdir = tempfile.mkdtemp(prefix="ottla-append-", dir=directory)
    try:
        log = Log(Path(workdir) / "bench-0", TopicConfig(BrokerConfig(), {}))
        started = perf_counter()
        for _ in range(count):
            log.append(batch, now_ms=1_000)
        seconds = perf_counter() - started
        log.close()
        return seconds
    finally:
        shutil.rmtree(workdir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the log is written (default /dev/shm)")
    parser.add_argument("--megabytes", type=int, default=256, help="data appended per trial")
    parser.add_argument("--trials", type=int, default=5, help="trials per batch size; the median is reported")
    args = parser.parse_args()

    cases = [("1 record of 100 B", 1, 100, None), ("1,000 records of 100 B", 1_000, 100, None),
             ("2,500 records of 100 B, 7-byte keys (Spark's sink)", 2_500, 100, None, True),
             ("1,000 records of 1 KiB", 1_000, 1024, None),
             ("1,000 records of 100 B, lz4", 1_000, 100, "lz4"),
             ("1,000 records of 1 KiB, lz4", 1_000, 1024, "lz4"),
             ("1,000 records of 1 KiB, gzip", 1_000, 1024, "gzip")]
    print(f"Log.append into {args.dir or tempfile.gettempdir()}, {args.megabytes} MB per trial, "
          f"median of {args.trials} trials; load average {os.getloadavg()[0]:.2f}\n")
    print("| batch | batch bytes | appends/s | MB/s | us per append |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, records, value_size, compression, *keys in cases:
        batch = _batch(records, value_size, compression, *keys)
        count = max(1_000, args.megabytes * 1_000_000 // len(batch)) if records > 1 else 50_000
        progress(f"{name}: {count:,} appends x {args.trials} trials")
        seconds = statistics.median(_trial(args.dir, batch, count) for _ in range(args.trials))
        print(f"| {name} | {len(batch):,} | {count / seconds:,.0f} | {count * len(batch) / seconds / 1e6:,.0f} | "
              f"{seconds / count * 1e6:,.1f} |")
    print(f"\n- command: python benchmarks/log_append.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
