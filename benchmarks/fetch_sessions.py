"""Incremental fetch sessions (KIP-227): what a fetch round over 1,000 idle partitions costs
with and without a session.

1. Consumer rounds, one broker: `ottla serve` with TOPICS x PARTITIONS partitions (default
   10 x 100), a raw Fetch v12 client (replica id -1, max wait 0) that fetches all of them
   ROUNDS times back to back, as full fetches (session epoch -1: every partition named and
   answered) and in a session (after the first, empty requests and empty answers); the two
   modes alternate REPEAT times. Per round: request and response bytes, the broker's CPU
   (/proc utime+stime over the rounds), the client's wall time.
2. Follower rounds, two brokers (`ottla.testing.cluster`, a real ZooKeeper): the same
   partitions with replication factor 2, all led by broker 2 and followed by broker 1, left
   idle for WINDOW seconds; the CPU both brokers burn per second, where an idle follower
   round is one replica.fetch.wait.max.ms (500 ms) long poll. "Without" is the same code with
   `max.incremental.fetch.session.cache.slots=0` on the leader, so it never creates a session
   and the follower keeps sending full fetches (Ottla before sessions).

    PYTHONPATH=src python benchmarks/fetch_sessions.py [--rounds 300] [--repeat 2] [--window 30] [--skip-cluster]
        [--modes full]  # a broker without sessions (e.g. PYTHONPATH of an older tree)

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12 import request as fetch12

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, cpu_seconds, progress  # noqa: E402

from ottla.protocol.codec import decode_response, encode_request  # noqa: E402

FETCH = 1


def _request(topics: list[str], partitions: int, session_id: int, epoch: int, *, named: bool):
    return fetch12.FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=50 << 20, isolation_level=0,
        session_id=session_id, session_epoch=epoch,
        topics=tuple(fetch12.FetchTopic(topic=t, partitions=tuple(
            fetch12.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                   log_start_offset=-1, partition_max_bytes=1 << 20)
            for p in range(partitions))) for t in topics) if named else (),
        forgotten_topics_data=(), rack_id="")


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(count):
        data = bytearray()
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return bytes(data)
    return exactly(int.from_bytes(exactly(4), "big"))


def consumer_rounds(broker: Ottla, topics: list[str], partitions: int, rounds: int, session: bool) -> dict:
    """`rounds` fetch rounds over every partition; per-round averages."""
    host, _, port = broker.bootstrap.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        session_id, epoch = 0, (0 if session else -1)
        sent = received = 0
        cpu_before = cpu_seconds(broker.proc.pid)
        started = time.perf_counter()
        for correlation_id in range(1, rounds + 1):
            request = _request(topics, partitions, session_id, epoch, named=epoch <= 0)
            frame = encode_request(request, correlation_id, "bench")
            sock.sendall(frame)
            answer = _read_frame(sock)
            _, response = decode_response(answer, FETCH, 12)
            sent += len(frame)
            received += len(answer) + 4
            if response.error_code:
                raise RuntimeError(f"Fetch answered {response.error_code}")
            if session:
                session_id, epoch = response.session_id, epoch + 1
        wall = time.perf_counter() - started
        cpu = cpu_seconds(broker.proc.pid) - cpu_before
    return {"request_bytes": sent / rounds, "response_bytes": received / rounds,
            "broker_cpu_ms": cpu / rounds * 1000, "wall_ms": wall / rounds * 1000}


def part_one(args, children: Children, root: Path) -> list[tuple[str, dict]]:
    broker = Ottla(children, root / "one")
    broker.start()
    topics = [f"idle-{i}" for i in range(args.topics)]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(t, args.partitions, 1) for t in topics], request_timeout=120).values():
        future.result(180)
    consumer_rounds(broker, topics, args.partitions, 20, session=False)  # warm-up
    results = []
    for repeat in range(args.repeat):
        for session in [mode == "session" for mode in args.modes.split(",")]:
            progress(f"consumer rounds, {'session' if session else 'full'}, repeat {repeat + 1}")
            results.append(("session" if session else "full", consumer_rounds(broker, topics, args.partitions,
                                                                                args.rounds, session)))
    broker.stop()
    return results


def part_two(args, root: Path) -> list[tuple[str, float, float]]:
    from ottla.testing import cluster

    results = []
    total = args.topics * args.partitions
    for slots in (0, 1000):
        label = "session" if slots else "full (slots=0)"
        progress(f"follower rounds: {label}")
        with cluster(brokers=1, root=root / f"cluster-{slots}", log_level="warning") as handle:
            leader = handle.add_broker(config={"max.incremental.fetch.session.cache.slots": slots})
            admin = AdminClient({"bootstrap.servers": handle.bootstrap, "log_level": 0})
            topics = [f"followed-{i}" for i in range(args.topics)]
            for future in admin.create_topics([NewTopic(t, num_partitions=args.partitions,
                                                        replica_assignment=[[2, 1]] * args.partitions)
                                               for t in topics], request_timeout=120).values():
                future.result(180)
            deadline = time.monotonic() + 300
            while True:
                meta = admin.list_topics(timeout=10).topics
                in_sync = sum(1 for t in topics if t in meta for p in meta[t].partitions.values()
                              if sorted(p.isrs) == [1, 2])
                if in_sync == total:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{in_sync} of {total} partitions in sync")
                time.sleep(1)
            time.sleep(5)  # the follower's start behind it
            follower = handle.brokers[1]
            before = cpu_seconds(leader.pid), cpu_seconds(follower.pid)
            time.sleep(args.window)
            after = cpu_seconds(leader.pid), cpu_seconds(follower.pid)
            results.append((label, (after[0] - before[0]) / args.window * 1000,
                            (after[1] - before[1]) / args.window * 1000))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100, help="partitions per topic")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--window", type=float, default=30, help="seconds the idle followers are measured")
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--modes", default="full,session",
                        help="consumer modes; 'full' alone for a broker without sessions")
    args = parser.parse_args()
    total = args.topics * args.partitions
    with tempfile.TemporaryDirectory(prefix="ottla-bench-sessions-") as tmp, Children() as children:
        consumer = part_one(args, children, Path(tmp))
        print(f"\nConsumer fetch rounds over {total} idle partitions, one broker, "
              f"{args.rounds} rounds x {args.repeat}:\n")
        print("| mode | request bytes | response bytes | broker CPU ms / round | wall ms / round |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for mode in args.modes.split(","):
            rows = [r for m, r in consumer if m == mode]
            cpu = " / ".join("%.2f" % r["broker_cpu_ms"] for r in rows)
            wall = " / ".join("%.2f" % r["wall_ms"] for r in rows)
            print(f"| {mode} | {statistics.mean(r['request_bytes'] for r in rows):,.0f} "
                  f"| {statistics.mean(r['response_bytes'] for r in rows):,.0f} | {cpu} | {wall} |", flush=True)
        if args.skip_cluster:
            return
        follower = part_two(args, Path(tmp))
    print(f"\nIdle follower, {total} partitions RF 2 on two brokers, {args.window:.0f} s:\n")
    print("| mode | leader CPU ms / s | follower CPU ms / s |")
    print("| --- | ---: | ---: |")
    for label, leader_ms, follower_ms in follower:
        print(f"| {label} | {leader_ms:.1f} | {follower_ms:.1f} |")


if __name__ == "__main__":
    main()
