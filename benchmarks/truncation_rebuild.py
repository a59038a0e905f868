"""A follower's truncation far above the last producer snapshot, or a first use of producer state
after a start with the last snapshot lost, in-process: the CPU it holds.

Snapshots are taken at segment roll and clean shutdown only, so a truncation replays up to a
whole segment of batches. This fills one partition (no roll: segment.bytes 1 GiB) with
--batches one-record idempotent batches of --producers producers in turn, truncates
--cut-back batches below the end, and reports the CPU of the truncation with the rebuild run
to its end in one piece (what anything using the state does) and the CPU of the longest step
the replica fetcher runs between two turns of the event loop (`Log.rebuild_step`).

`--first-use`: the log is closed cleanly, its snapshot at the log end deleted (lost or
unreadable: the load falls back to the log start) and opened again; reported are the CPU of
the first use of its producer state loaded in one piece and of the longest step of the load
the server runs between two turns of the loop (`steps.producer_state_ready`).

    PYTHONPATH=src .venv/bin/python benchmarks/truncation_rebuild.py --batches 50000
    PYTHONPATH=src .venv/bin/python benchmarks/truncation_rebuild.py --batches 50000 --first-use

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


def stepped(step) -> tuple[int, float]:
    """Steps run until `step()` says none is left, and the CPU of the longest."""
    steps, longest = 0, 0.0
    while True:
        start = time.process_time()
        more = step()
        longest = max(longest, time.process_time() - start)
        if not more:
            return steps, longest
        steps += 1


def reopened_without_snapshot(path: Path, log: Log) -> Log:
    end = log.log_end_offset
    log.close()
    for snapshot in path.glob("*.snapshot"):
        snapshot.unlink()
    return Log(path, log.config, recovery_point=end, clean_shutdown=True)


def first_use(path: Path, args) -> None:
    log = filled(path, args.batches, args.producers)
    end = log.log_end_offset
    log = reopened_without_snapshot(path, log)
    start = time.process_time()
    log.producer_state.active_producers()  # the first use, in one piece
    whole = time.process_time() - start
    log = reopened_without_snapshot(path, log)
    steps, longest = stepped(lambda: log.rebuild_step(load=True))
    assert log.producer_state_ready
    log.close()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| batches replayed | producers | first use in one piece, CPU ms | steps | longest step, CPU ms |")
    print("|---|---|---|---|---|")
    print(f"| {end:,} | {args.producers:,} | {whole * 1000:.0f} | {steps} | {longest * 1000:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50_000)
    parser.add_argument("--producers", type=int, default=1_000)
    parser.add_argument("--cut-back", type=int, default=10)
    parser.add_argument("--first-use", action="store_true",
                        help="the first use after a start with the last snapshot lost, not a truncation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="truncation-rebuild-") as tmp:
        if args.first_use:
            first_use(Path(tmp) / "t-0", args)
            return
        log = filled(Path(tmp) / "t-0", args.batches, args.producers)
        cut = log.log_end_offset - args.cut_back
        assert not log.producer_state.snapshot_offsets
        start = time.process_time()
        log.truncate_to(cut)
        log.producer_state.active_producers()  # runs the rebuild to its end in one piece
        whole = time.process_time() - start
        log.truncate_to(cut - 1)
        steps, longest = stepped(log.rebuild_step)
        log.close()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| batches replayed | producers | truncation in one piece, CPU ms | steps | longest step, CPU ms |")
    print("|---|---|---|---|---|")
    print(f"| {cut:,} | {args.producers:,} | {whole * 1000:.0f} | {steps} | {longest * 1000:.1f} |")


if __name__ == "__main__":
    main()
