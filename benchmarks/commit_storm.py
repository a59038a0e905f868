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
`__consumer_offsets`. A kill -9 restart (the active segment is rescanned) is timed as well.
With --no-cleaner the storm runs with log.cleaner.enable=false, for comparison.

    .venv/bin/python benchmarks/commit_storm.py --commits 1000000
    .venv/bin/python benchmarks/commit_storm.py --commits 200000 --no-cleaner

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i64

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, progress  # noqa: E402

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
    args = parser.parse_args()
    config = {"offsets.topic.num.partitions": "1", "offsets.topic.segment.bytes": str(int(args.segment_mb * 2**20)),
              "log.cleaner.backoff.ms": "1000", "log.cleaner.enable": str(not args.no_cleaner).lower()}
    extra = [item for key, value in config.items() for item in ("--config", f"{key}={value}")]
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-storm-") as tmp:
        root = Path(tmp)
        baseline = Ottla(children, root / "empty", extra)
        baseline_s = baseline.start()
        baseline.stop()
        broker = Ottla(children, root / "storm", extra + ["--log-level", "info"])
        broker.start()
        progress(f"committing {args.commits:,} times")
        storm_s = storm(broker.bootstrap, args.commits, args.connections)
        directory = broker.data_dir / "__consumer_offsets-0"
        deadline = time.monotonic() + args.settle
        while not args.no_cleaner and time.monotonic() < deadline:
            active = max(int(p.name[:-4]) for p in directory.glob("*.log"))
            if checkpoint(broker.data_dir) >= active:
                break
            time.sleep(1)
        broker.stop()
        size, records, segments, in_active = partition_stats(directory)
        start_s = broker.start()
        os.kill(broker.proc.pid, signal.SIGKILL)
        broker.proc.wait()
        crash_start_s = broker.start()
        broker.stop()
    print("| cleaner | commits | commits/s | __consumer_offsets MiB | records | segments | records in active segment "
          "| start s | kill -9 start s | baseline start s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {'off' if args.no_cleaner else 'on'} | {args.commits:,} | {args.commits / storm_s:,.0f} | "
          f"{size / 2**20:.1f} | {records:,} | {segments} | {in_active:,} | {start_s:.2f} | {crash_start_s:.2f} | "
          f"{baseline_s:.2f} |")
    print()
    print(f"- 1 group, {args.connections} live offsets (one per committing connection); __consumer_offsets: 1 partition, {args.segment_mb:g} MiB segments")
    print(f"- {os.cpu_count()} CPUs; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"run took {time.monotonic() - started:.0f}s")
    print(f"- command: python benchmarks/commit_storm.py --commits {args.commits} --segment-mb {args.segment_mb:g} "
          f"--connections {args.connections}"
          + (" --no-cleaner" if args.no_cleaner else ""))


if __name__ == "__main__":
    main()
