"""The CPU of one partition's read for a Fetch (`Log.read(lazy=True)`), without the broker (issue 16).

    PYTHONPATH=src .venv/bin/python benchmarks/log_read.py
    PYTHONPATH=src .venv/bin/python benchmarks/log_read.py --records 250 --reps 21

A log of `--batches` batches of `--records` records (key = the row number, value = the row number
padded to `--size` bytes), with the default `index.interval.bytes`, read from the start to the end
in `--max-bytes` reads, each continuing after the last batch the one before returned, as a
consumer at its fetch offset does. The records stay in the file (a FileRecords, what the broker
sends from), so a read costs the offset index lookups and the batch headers it walks. Prints the
microseconds per read: each rep reads the log 20 times; median and least of the reps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ottla.config import BrokerConfig, TopicConfig
from ottla.log import Log
from ottla.records.records import Record, build_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--records", type=int, default=2_500, help="records per batch")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="max.partition.fetch.bytes")
    parser.add_argument("--reps", type=int, default=41)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        log = Log(Path(directory) / "t-0", TopicConfig(BrokerConfig(), {}))
        for b in range(args.batches):
            rows = range(b * args.records, (b + 1) * args.records)
            log.append(build_batch([Record(str(i).encode(), str(i).zfill(args.size).encode(), (), i) for i in rows],
                                   producer_id=-1, producer_epoch=-1, base_sequence=-1, is_transactional=False,
                                   compression=0), now_ms=0)
        log.update_high_watermark(log.log_end_offset)
        end = log.log_end_offset
        batch_bytes = sum(f.stat().st_size for f in (Path(directory) / "t-0").glob("*.log")) // args.batches
        per_read = []
        for _ in range(args.reps):
            reads = 0
            started = time.perf_counter()
            for _ in range(20):
                offset = 0
                while offset < end:
                    records = log.read(offset, args.max_bytes, max_offset=end, lazy=True).records
                    offset += args.records * max(1, len(records) // batch_bytes)
                    reads += 1
            per_read.append((time.perf_counter() - started) / reads * 1e6)
        log.close()
    print("| batch bytes | reads per pass | us per read (median) | least | load |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(f"| {batch_bytes:,} | {reads // 20} | {statistics.median(per_read):.1f} | {min(per_read):.1f} | "
          f"{os.getloadavg()[0]:.1f} |")
    print(f"- command: python benchmarks/log_read.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
