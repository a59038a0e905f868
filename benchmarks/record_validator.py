"""CPU cost of the produce path's record validation (`records/validator.py`), in-process.

    .venv/bin/python benchmarks/record_validator.py
    .venv/bin/python benchmarks/record_validator.py --rounds 30

For batches of a few shapes (what kcat and librdkafka send, and mixed sizes), the CPU time of
`check_records` per batch and per MB of batch: the fastest of `--rounds` rounds over 8
different batches of each shape, in process time, so that a busy machine disturbs it less
than wall-clock time would. Compare two trees by running it with each on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from ottla.records.batch import read_header
from ottla.records.records import Record, build_batch
from ottla.records.validator import check_records, inflate_limit

_NOW = 1_700_000_000_000


def _batches(sizes_of, count: int = 8, keys: bool = False, stamp_step_us: int = 0) -> list[bytes]:
    """`count` batches; `sizes_of()` gives one batch's value sizes. Stamps advance by
    `stamp_step_us` microseconds a record (librdkafka stamps in milliseconds)."""
    return [build_batch([Record(os.urandom(8) if keys else None, os.urandom(size), (), _NOW + i * stamp_step_us // 1000)
                         for i, size in enumerate(sizes_of())], now_ms=_NOW) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds per shape; the fastest is reported")
    args = parser.parse_args()
    rng = random.Random(7)
    shapes = [
        ("966 x 1 KiB (a full kcat batch)", _batches(lambda: [1024] * 966, stamp_step_us=500)),
        ("170 x 1 KiB", _batches(lambda: [1024] * 170, stamp_step_us=1_500)),
        ("9,000 x 100 B", _batches(lambda: [100] * 9_000, stamp_step_us=50)),
        ("2,500 x 100 B, 8-byte keys (Spark's sink)", _batches(lambda: [100] * 2_500, keys=True)),
        ("950 x 10-2,000 B", _batches(lambda: [rng.randrange(10, 2_000) for _ in range(950)])),
        ("900 x 10-2,000 B, keys", _batches(lambda: [rng.randrange(10, 2_000) for _ in range(900)], keys=True,
                                            stamp_step_us=30_000)),
        ("200 x 100 B", _batches(lambda: [100] * 200)),
        ("50 x 1 KiB (the full walk)", _batches(lambda: [1024] * 50)),
        ("100,000 x 0-1 B, sizes alternating every 16 (hostile)",
         _batches(lambda: ([0] * 16 + [1] * 16) * 3_125, count=2)),
    ]
    limit = inflate_limit(1 << 20)
    print(f"check_records, fastest of {args.rounds} rounds of 8 batches each; load average {os.getloadavg()[0]:.2f}\n")
    print("| batch | bytes | us per batch | ms per MB |")
    print("| --- | ---: | ---: | ---: |")
    for name, batches in shapes:
        headers = [read_header(batch) for batch in batches]
        best = min(_round(batches, headers, limit) for _ in range(args.rounds))
        size = sum(len(batch) for batch in batches) / len(batches)
        print(f"| {name} | {size:,.0f} | {best * 1e6:,.1f} | {best / size * 1e9:.3f} |")
    print(f"\n- command: python benchmarks/record_validator.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


def _round(batches, headers, limit) -> float:
    started = time.process_time()
    for batch, header in zip(batches, headers):
        check_records(batch, header, limit)
    return (time.process_time() - started) / len(batches)


if __name__ == "__main__":
    sys.exit(main())
