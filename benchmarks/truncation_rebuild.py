"""A follower's truncation far above the last producer snapshot, in-process: the CPU it holds.

Snapshots are taken at segment roll and clean shutdown only, so a truncation replays up to a
whole segment of batches. This fills one partition (no roll: segment.bytes 1 GiB) with
--batches one-record idempotent batches of --producers producers in turn, truncates
--cut-back batches below the end, and reports the CPU of the truncation with the rebuild run
to its end in one piece (what anything using the state does) and the CPU of the longest step
the replica fetcher runs between two turns of the event loop (`Log.rebuild_step`).

    PYTHONPATH=src .venv/bin/python benchmarks/truncation_rebuild.py --batches 50000

Results table (Markdown) on stdout; see docs/performance.md (replication).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ottla.config import BrokerConfig, TopicConfig
from ottla.log import Log
from ottla.records.records import Record, build_batch


def filled(path: Path, batches: int, producers: int) -> Log:
    log = Log(path, TopicConfig(BrokerConfig(), {"segment.bytes": str(1 << 30)}))
    seqs = [0] * producers
    for i in range(batches):
        pid = i % producers
        log.append(build_batch([Record(b"k", b"v" * 100, (), 1_000 + i)], producer_id=pid, producer_epoch=0,
                               base_sequence=seqs[pid]), now_ms=0)
        seqs[pid] += 1
    log.update_high_watermark(log.log_end_offset)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50_000)
    parser.add_argument("--producers", type=int, default=1_000)
    parser.add_argument("--cut-back", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="truncation-rebuild-") as tmp:
        log = filled(Path(tmp) / "t-0", args.batches, args.producers)
        cut = log.log_end_offset - args.cut_back
        assert not log.producer_state.snapshot_offsets
        start = time.process_time()
        log.truncate_to(cut)
        log.producer_state.active_producers()  # runs the rebuild to its end in one piece
        whole = time.process_time() - start
        log.truncate_to(cut - 1)
        steps, longest = 0, 0.0
        while True:
            start = time.process_time()
            more = log.rebuild_step()
            longest = max(longest, time.process_time() - start)
            if not more:
                break
            steps += 1
        log.close()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| batches replayed | producers | truncation in one piece, CPU ms | steps | longest step, CPU ms |")
    print("|---|---|---|---|---|")
    print(f"| {cut:,} | {args.producers:,} | {whole * 1000:.0f} | {steps} | {longest * 1000:.1f} |")


if __name__ == "__main__":
    main()
