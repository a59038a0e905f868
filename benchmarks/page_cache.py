"""How fast this machine takes appends into the page cache: the floor under every produce.

Appends `--megabytes` of data in 1 MB `os.write` calls to a new file (no fsync), several
times; each trial's file is deleted before the next, so later trials get the page-cache
memory the earlier ones freed. On a bare-metal machine all trials run at memory speed. In
a VM whose host hands out guest memory lazily and takes idle memory back (balloon, free page
reporting, DAMON reclaim), a trial that needs pages the guest has not touched lately is
several times slower than one that reuses pages just freed: that is the cost a broker pays
for every new byte it stores, and the mock cluster, which keeps a few MB per partition,
never pays it. Run it just before a produce benchmark to see which state the machine is in.

    .venv/bin/python benchmarks/page_cache.py
    .venv/bin/python benchmarks/page_cache.py --dir /path/on/the/data/disk --megabytes 2000

Results table (Markdown) on stdout; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from time import perf_counter

CHUNK = 1 << 20


def _append_new_file(directory: str, megabytes: int) -> float:
    chunk = os.urandom(CHUNK)
    fd, path = tempfile.mkstemp(prefix="ottla-page-cache-", dir=directory)
    try:
        started = perf_counter()
        for _ in range(megabytes):
            os.write(fd, chunk)
        return megabytes * CHUNK / (perf_counter() - started) / 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a directory on the disk to test")
    parser.add_argument("--megabytes", type=int, default=1000, help="MB appended per trial")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.megabytes} MB appended to a new file in {args.dir} per trial; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| trial | MB/s |")
    print("| ---: | ---: |")
    for trial in range(1, args.trials + 1):
        print(f"| {trial} | {_append_new_file(args.dir, args.megabytes):,.0f} |", flush=True)
    print(f"\n- command: python benchmarks/page_cache.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
