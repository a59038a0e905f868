"""A commit storm on one Ottla broker this script starts: one consumer group commits --commits
times (one offset per OffsetCommit, over --connections connections that each commit their own
partition and wait for each answer, as a consumer does), then the size of `__consumer_offsets`
and the time a restart takes to load it.

`__consumer_offsets` has 1 partition here (offsets.topic.num.partitions=1) with
--segment-mb MiB segments (Kafka's default is 100 MiB: the active segment is never cleaned,
so with the default most of a storm this size would sit in it). After the storm the script
waits until the cleaner has cleaned up to the active segment (or --settle seconds passed),
stops the broker cleanly, counts the records and bytes of the partition, and starts it
again: "start" is the time from launching `ottla serve` until it answers Metadata, against
the same for an empty data directory ("baseline"); the difference is loading
`__consumer_offsets`. The group's offsets are loaded on the event loop after the broker starts
serving, so "offsets" is the time from launching until OffsetFetch for the group answers
with every committed offset (no COORDINATOR_LOAD_IN_PROGRESS): what a consumer waits for;
"load ms" is the broker's own "finished loading __consumer_offsets-0 ... in N ms" figure (the
load alone, from its start on the event loop).
"serving s" is the broker's own figure, from the kernel's start of its process (interpreter
start and imports included) to its "serving on" line. A kill -9 restart is timed as well: the
broker is killed after the clean restarts and its recovery point for `__consumer_offsets-0` is
put back to the active segment's base offset, where a kill -9 during the storm leaves it (the
commits fdatasync the .log but do not move the recovery point), so the active segment is
rescanned as it would be. With --restarts N the clean restart is timed N times and each
figure is the median (min-max).
With --no-cleaner the storm runs with log.cleaner.enable=false, for comparison. With
--data-dir DIR the stormed data directory is DIR and is kept; if DIR already holds a storm,
the storm is skipped and only the restarts are timed (the same data for before and after).

    .venv/bin/python benchmarks/commit_storm.py --commits 1000000
    .venv/bin/python benchmarks/commit_storm.py --commits 200000 --no-cleaner
    .venv/bin/python benchmarks/commit_storm.py --data-dir /tmp/stormed --restarts 5   # restarts only

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v6.request import OffsetFetchRequest
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i64

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, bytecode_cache_env, progress  # noqa: E402

from ottla.records.records import iter_batches  # noqa: E402


def _frame(request, correlation_id: int) -> bytes:
    header_type = type(request).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(request_api_key=request.__api_key__,
                                                request_api_version=request.__version__,
                                                correlation_id=correlation_id, client_id="commit-storm"))
    entity_writer(type(request))(out, request)
    return struct.pack(">i", len(out.getvalue())) + out.getvalue()


def _read_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4:
        data += sock.recv(4 - len(data))
    size = struct.unpack(">i", data)[0]
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _committer(bootstrap: str, partition: int, count: int, done: list[int]) -> None:
    """OffsetCommit v8 as a group without members commits (generation -1), one offset per
    request, waiting for each answer: librdkafka does the same, one connection at a time."""
    host, _, port = bootstrap.rpartition(":")
    schema = load_response_schema(8, 8)
    with socket.create_connection((host, int(port))) as sock:
        for i in range(1, count + 1):
            request = OffsetCommitRequest(group_id="storm", member_id="", topics=(OffsetCommitRequestTopic(
                name="input", partitions=(OffsetCommitRequestPartition(
                    partition_index=i32(partition), committed_offset=i64(i), committed_metadata=None),)),))
            sock.sendall(_frame(request, i))
            frame = _read_frame(sock)
            header, size = entity_reader(schema.__header_schema__)(frame, 0)
            body, _ = entity_reader(schema)(frame, size)
            error = body.topics[0].partitions[0].error_code
            if error != ErrorCode.none:
                raise RuntimeError(f"commit failed: {error!r}")
            done[partition] = i


def offsets_served(bootstrap: str, launched: float, expected: int, timeout: float = 300.0) -> float:
    """Seconds from `launched` until OffsetFetch v6 for the group answers `expected` offsets."""
    host, _, port = bootstrap.rpartition(":")
    schema = load_response_schema(9, 6)
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port))) as sock:
        for correlation_id in range(1, 1 << 30):
            sock.sendall(_frame(OffsetFetchRequest(group_id="storm", topics=None), correlation_id))
            frame = _read_frame(sock)
            header, size = entity_reader(schema.__header_schema__)(frame, 0)
            body, _ = entity_reader(schema)(frame, size)
            found = sum(1 for t in body.topics for p in t.partitions if p.committed_offset >= 0)
            if body.error_code == ErrorCode.none and found == expected:
                return time.monotonic() - launched
            if body.error_code not in (ErrorCode.none, ErrorCode.coordinator_load_in_progress):
                raise RuntimeError(f"OffsetFetch failed: {body.error_code!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group's offsets were not served within {timeout:.0f}s")
            time.sleep(0.005)
    raise AssertionError("unreachable")


class Start(NamedTuple):
    serving_s: float  # the broker's own: process start to its "serving on" line
    metadata_s: float  # launch until Metadata answers
    offsets_s: float  # launch until OffsetFetch answers every committed offset
    load_ms: float  # the broker's own figure for loading __consumer_offsets-0, on its event loop


def timed_start(broker: Ottla, connections: int) -> Start:
    logged = len(broker.log_lines())
    launched = time.monotonic()
    metadata_s = broker.start()
    offsets_s = offsets_served(broker.bootstrap, launched, connections)
    load_ms = float("nan")
    for line in broker.log_lines()[logged:]:  # "finished loading __consumer_offsets-0 (N bytes) in M ms"
        if "finished loading __consumer_offsets-0 " in line:
            load_ms = float(line.rpartition(" in ")[2].split()[0])
    return Start(broker.serving_s() or float("nan"), metadata_s, offsets_s, load_ms)


def spread(values: list[float], digits: int = 2) -> str:
    """The median, and the range when there are several."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def storm(bootstrap: str, commits: int, connections: int) -> float:
    """`commits` commits over `connections` connections (each its own partition of `input`)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("input", connections, 1)])["input"].result(30)
    done = [0] * connections
    per_connection = commits // connections
    threads = [threading.Thread(target=_committer, args=(bootstrap, p, per_connection, done), daemon=True)
               for p in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        time.sleep(5)
        progress(f"{sum(done):,} commits, {sum(done) / (time.monotonic() - started):,.0f}/s")
    if sum(done) != per_connection * connections:
        raise RuntimeError("a committer failed")
    return time.monotonic() - started


def checkpoint(data_dir: Path) -> int:
    try:
        for line in (data_dir / "cleaner-offset-checkpoint").read_text().splitlines()[2:]:
            topic, partition, offset = line.split()
            if (topic, partition) == ("__consumer_offsets", "0"):
                return int(offset)
    except FileNotFoundError:
        pass
    return -1


def rewind_recovery_point(data_dir: Path, offset: int) -> None:
    """Set `__consumer_offsets-0`'s entry of recovery-point-offset-checkpoint to `offset`."""
    path = data_dir / "recovery-point-offset-checkpoint"
    lines = path.read_text().splitlines()
    lines = [f"__consumer_offsets 0 {offset}" if line.startswith("__consumer_offsets 0 ") else line for line in lines]
    path.write_text("\n".join(lines) + "\n")


def partition_stats(directory: Path) -> tuple[int, int, int, int]:
    """(bytes, records, segments, records in the active segment) of a partition directory."""
    logs = sorted(directory.glob("*.log"), key=lambda p: int(p.name[:-4]))
    counts = [sum(len(records) for _, records in iter_batches(p.read_bytes())) for p in logs]
    return sum(p.stat().st_size for p in logs), sum(counts), len(logs), counts[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--segment-mb", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=120.0)
    parser.add_argument("--connections", type=int, default=32, help="committing connections, one partition each")
    parser.add_argument("--no-cleaner", action="store_true")
    parser.add_argument("--data-dir", type=Path, help="the stormed data dir: kept, and reused if it holds a storm")
    parser.add_argument("--restarts", type=int, default=1, help="clean restarts timed (median reported)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="leave PYTHONDONTWRITEBYTECODE as it is: brokers compile their modules at each start")
    args = parser.parse_args()
    config = {"offsets.topic.num.partitions": "1", "offsets.topic.segment.bytes": str(int(args.segment_mb * 2**20)),
              "log.cleaner.backoff.ms": "1000", "log.cleaner.enable": str(not args.no_cleaner).lower()}
    extra = [item for key, value in config.items() for item in ("--config", f"{key}={value}")]
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-storm-") as tmp:
        root = Path(tmp)
        env = None if args.no_bytecode_cache else bytecode_cache_env(root / "pycache")
        baseline = Ottla(children, root / "empty", extra, env)
        baseline_metadata_s = baseline.start()
        baseline_serving_s = baseline.serving_s() or float("nan")
        baseline.stop()
        data_dir = args.data_dir or root / "storm"
        reused = (data_dir / "__consumer_offsets-0").is_dir()
        broker = Ottla(children, data_dir, extra + ["--log-level", "info"], env)
        storm_s = float("nan")
        if not reused:
            broker.start()
            progress(f"committing {args.commits:,} times")
            storm_s = storm(broker.bootstrap, args.commits, args.connections)
        directory = broker.data_dir / "__consumer_offsets-0"
        deadline = time.monotonic() + args.settle
        while not reused and not args.no_cleaner and time.monotonic() < deadline:
            active = max(int(p.name[:-4]) for p in directory.glob("*.log"))
            if checkpoint(broker.data_dir) >= active:
                break
            time.sleep(1)
        if not reused:
            broker.stop()
        size, records, segments, in_active = partition_stats(directory)
        if args.data_dir is not None:  # restored at the end: the next run restarts from the same bytes
            shutil.copytree(data_dir, root / "backup")
        starts = []
        for i in range(args.restarts):
            if i:
                broker.stop()
            starts.append(timed_start(broker, args.connections))
            progress(f"restart {i + 1}: {starts[-1]}")
        os.kill(broker.proc.pid, signal.SIGKILL)
        broker.proc.wait()
        rewind_recovery_point(broker.data_dir, max(int(p.name[:-4]) for p in directory.glob("*.log")))
        crash = timed_start(broker, args.connections)
        broker.stop()
        if args.data_dir is not None:
            shutil.rmtree(data_dir)
            shutil.copytree(root / "backup", data_dir)
    print("| cleaner | commits | commits/s | __consumer_offsets MiB | records | segments | records in active segment "
          "| serving s | start s | offsets s | load ms | kill -9 serving s | kill -9 offsets s | kill -9 load ms "
          "| baseline serving s | baseline start s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rate = "(reused)" if reused else f"{args.commits / storm_s:,.0f}"
    print(f"| {'off' if args.no_cleaner else 'on'} | {args.commits:,} | {rate} | "
          f"{size / 2**20:.1f} | {records:,} | {segments} | {in_active:,} | "
          f"{spread([s.serving_s for s in starts])} | {spread([s.metadata_s for s in starts])} | "
          f"{spread([s.offsets_s for s in starts])} | {spread([s.load_ms for s in starts], 0)} | "
          f"{crash.serving_s:.2f} | {crash.offsets_s:.2f} | {crash.load_ms:.0f} | "
          f"{baseline_serving_s:.2f} | {baseline_metadata_s:.2f} |")
    print()
    print(f"- bytecode: {'compiled at each start (PYTHONDONTWRITEBYTECODE as set)' if args.no_bytecode_cache else 'cached'}")
    print(f"- 1 group, {args.connections} live offsets (one per committing connection); __consumer_offsets: 1 partition, {args.segment_mb:g} MiB segments")
    print(f"- {os.cpu_count()} CPUs; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"run took {time.monotonic() - started:.0f}s")
    print(f"- command: python benchmarks/commit_storm.py --commits {args.commits} --segment-mb {args.segment_mb:g} "
          f"--connections {args.connections}"
          + (" --no-cleaner" if args.no_cleaner else "")
          + (f" --data-dir {args.data_dir}" if args.data_dir else "")
          + (f" --restarts {args.restarts}" if args.restarts != 1 else "")
          + (" --no-bytecode-cache" if args.no_bytecode_cache else ""))


if __name__ == "__main__":
    main()
