"""How fast the group coordinator loads a `__consumer_offsets` partition, in-process.

Writes --commits offset commits (one offset per commit, --offsets distinct partitions of one
group, as a commit storm does; commit i goes to group `storm-<i mod --groups>`, so --groups
100000 --commits 100000 --offsets 1 is 100,000 separate groups of one offset each) through an
in-process broker's group coordinator into a 1-partition `__consumer_offsets` whose segments do
not roll (the active segment is never cleaned: this is what a restart after a storm replays),
stops the broker, then times loading that partition again --trials times (CPU and wall clock,
best of the trials), and --trials times as a started broker loads it, in steps on its event
loop (the longest step).
No sockets and no subprocess: the figure is the replay itself, not process start. "open s" is
constructing the broker over the data dir (its logs opened after a clean shutdown), "open
after kill -9 s" the same with the clean-shutdown marker and the recovery points removed, as
a kill -9 before the first checkpoint leaves them: the active segment is rescanned (CRC and
producer state of every batch) before the load can start.

    PYTHONPATH=src .venv/bin/python benchmarks/offsets_load.py --commits 64000

Results table (Markdown) on stdout; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from ottla.config import BrokerConfig
from ottla.coordinator.group import OffsetCommit
from ottla.errors import ErrorCode
from ottla.log.manager import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_FILE
from ottla.server.broker import Broker
from ottla.server.clock import now_ms

CONFIG = {"offsets.topic.num.partitions": 1, "transaction.state.log.num.partitions": 1,
          "offsets.topic.segment.bytes": 1 << 30, "log.cleaner.enable": False}


async def _storm(data_dir: Path, commits: int, offsets: int, groups: int) -> None:
    broker = Broker(data_dir, BrokerConfig(CONFIG), port=0)
    await broker.start()
    try:
        coordinator = broker.groups.coordinator
        while (coordinator.fetch_offsets(group_id="storm-0", partitions=None).error
               == ErrorCode.coordinator_load_in_progress):
            await asyncio.sleep(0.01)
        pending: list[asyncio.Future] = []
        for i in range(commits):
            done = asyncio.get_running_loop().create_future()
            coordinator.commit_offsets(group_id=f"storm-{i % groups}", member_id="", group_instance_id=None,
                                       generation_id=-1, offsets={("input", i % offsets): OffsetCommit(i)},
                                       now_ms=now_ms(), on_complete=done.set_result)
            pending.append(done)
            if len(pending) >= 512:  # as many in flight as a few hundred connections
                for result in await asyncio.gather(*pending):
                    assert set(result.values()) == {ErrorCode.none}, result
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await broker.stop()


def _crash(data_dir: Path) -> None:
    """Leave the data dir as a kill -9 before any offset checkpoint would: no clean-shutdown
    marker and no recovery point, so opening it rescans every segment (here: the one)."""
    (data_dir / CLEAN_SHUTDOWN_FILE).unlink()
    (data_dir / RECOVERY_POINT_FILE).unlink()


def _load(data_dir: Path) -> tuple[float, float, float, int]:
    """(wall s of opening the broker's logs, CPU s and wall s of loading `__consumer_offsets-0`,
    offsets loaded)."""
    opened = time.perf_counter()
    broker = Broker(data_dir, BrokerConfig(CONFIG), port=0)
    opened = time.perf_counter() - opened
    try:
        groups = broker.groups.coordinator
        cpu, wall = time.process_time(), time.perf_counter()
        groups.load_partition(0, now_ms())
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        loaded = groups.fetch_offsets(group_id="storm-0", partitions=None)
        assert loaded.error == ErrorCode.none
        return opened, cpu, wall, len(loaded.offsets)
    finally:
        broker.logs.close()
        broker.release_data_dir()


async def _stepped(data_dir: Path) -> tuple[float, float, int]:
    """The load as a started broker runs it (through the coordinator runtime, in steps on the
    event loop): (wall s until the group's offsets are served, the longest single step of the
    loop meanwhile in ms of its CPU, steps)."""
    broker = Broker(data_dir, BrokerConfig(CONFIG), port=0)
    longest, turns, last = 0.0, 0, time.thread_time()
    started = time.perf_counter()
    await broker.start()
    try:
        groups = broker.groups.coordinator
        # A task that yields at every turn: the CPU between two of its turns is one step of
        # whatever else ran (the load's) plus its own few microseconds.
        while groups.fetch_offsets(group_id="storm-0", partitions=None).error == ErrorCode.coordinator_load_in_progress:
            await asyncio.sleep(0)
            now = time.thread_time()
            longest, turns, last = max(longest, now - last), turns + 1, now
        return time.perf_counter() - started, longest * 1000, turns
    finally:
        await broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=64_000)
    parser.add_argument("--offsets", type=int, default=64, help="distinct partitions committed (live offsets)")
    parser.add_argument("--groups", type=int, default=1, help="separate groups the commits go to")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ottla-offsets-load-") as tmp:
        data_dir = Path(tmp) / "data"
        asyncio.run(_storm(data_dir, args.commits, args.offsets, args.groups))
        size = sum(p.stat().st_size for p in (data_dir / "__consumer_offsets-0").glob("*.log"))
        trials, crashed, stepped = [], [], []
        for _ in range(args.trials):
            for results, crash in ((trials, False), (crashed, True)):
                copy = Path(tmp) / "trial"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(data_dir, copy)
                if crash:
                    _crash(copy)
                results.append(_load(copy))
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(data_dir, copy)
            stepped.append(asyncio.run(_stepped(copy)))
    open_s, cpu, wall = (min(t[i] for t in trials) for i in range(3))
    crash_open_s = min(t[0] for t in crashed)
    first_group = len({i % args.offsets for i in range(0, args.commits, args.groups)})  # storm-0's offsets
    assert all(t[3] == first_group for t in trials + crashed)
    print("| commits | groups | live offsets per group | partition MiB | open s | load CPU s | load wall s "
          "| records/s (CPU) | open after kill -9 s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.commits:,} | {args.groups:,} | {args.offsets} | {size / 2**20:.1f} | {open_s:.3f} | "
          f"{cpu:.3f} | {wall:.3f} | {args.commits / cpu:,.0f} | {crash_open_s:.3f} |")
    print()
    print("| stepped load (a started broker): offsets served after s | longest loop step, ms of CPU | loop turns |")
    print("|---:|---:|---:|")
    for wall_s, longest_ms, turns in stepped:
        print(f"| {wall_s:.3f} | {longest_ms:.1f} | {turns:,} |")
    print()
    print(f"- best of {args.trials} loads; {os.cpu_count()} CPUs; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(f"- command: python benchmarks/offsets_load.py --commits {args.commits} --offsets {args.offsets} "
          f"--groups {args.groups} --trials {args.trials}")


if __name__ == "__main__":
    main()
