"""Hostile load (issue 11): thousands of idle connections, consumers that never read their
responses, fetches asking for gigabytes, and a bystander producer measuring its latency.

    .venv/bin/python benchmarks/load.py --idle 5000 --stuck 200 --stuck-old 50 --fill-mb 8

Each stuck consumer sends one Fetch (v11, max_bytes and partition_max_bytes 2^31-1, from
offset 0 of a topic holding --fill-mb MB) and never reads; each of --stuck-old sends the same
as Fetch v3 (message format v1: the broker down-converts what it sends). Prints the broker's RSS before,
at its peak and after, the bystander's acks=all produce latency percentiles before and
during the load, and the broker's own account of its event loop (worst lag, longest steps
and garbage collections, logged at shutdown).
"""

from __future__ import annotations

import argparse
import re
import resource
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokerproc import progress  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic  # noqa: E402

from ottla.protocol.legacy.fetch.v3.request import FetchPartition as OldFetchPartition  # noqa: E402
from ottla.protocol.legacy.fetch.v3.request import FetchRequest as OldFetchRequest  # noqa: E402
from ottla.protocol.legacy.fetch.v3.request import FetchTopic as OldFetchTopic  # noqa: E402
from ottla.testing import broker  # noqa: E402
from ottla.testing.fuzz import encode  # noqa: E402


def _rss(pid: int, field: str = "VmRSS:") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def _latencies(bootstrap: str, seconds: float) -> list[float]:
    """acks=all produce latency of one 100-byte record every 10 ms, in ms."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    samples: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sent = time.monotonic()
        producer.produce("bystander", b"x" * 100, on_delivery=lambda err, msg, t=sent: samples.append(
            (time.monotonic() - t) * 1000) if err is None else None)
        producer.poll(0.01)
    producer.flush(60)
    return samples


def _percentiles(samples: list[float]) -> str:
    if len(samples) < 2:
        return "no samples"
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {max(samples):.1f} ms ({len(samples)} records)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=5000)
    parser.add_argument("--stuck", type=int, default=200)
    parser.add_argument("--stuck-old", type=int, default=0, help="stuck consumers sending Fetch v3")
    parser.add_argument("--fill-mb", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=10_000, help="of each record in the fetched partition")
    parser.add_argument("--compression", default="none", help="the filling producer's compression.type")
    parser.add_argument("--seconds", type=float, default=20.0, help="bystander measurement per phase")
    parser.add_argument("--config", action="append", default=[], help="broker config KEY=VALUE")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the broker inherits it
    config = dict(item.split("=", 1) for item in args.config)
    with broker(config, log_level="info") as handle:
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        for future in admin.create_topics([NewTopic("load", 1, 1), NewTopic("bystander", 1, 1)]).values():
            future.result(60)
        producer = Producer({"bootstrap.servers": handle.bootstrap, "linger.ms": 20,
                             "compression.type": args.compression})
        value = b"v" * args.value_bytes
        for _ in range(args.fill_mb * 1_000_000 // args.value_bytes):
            producer.produce("load", value)
            producer.poll(0)
        producer.flush(120)
        progress(f"filled 'load' with {args.fill_mb} MB")
        quiet = _latencies(handle.bootstrap, args.seconds)
        rss_before = _rss(handle.pid)

        address = (handle.host, handle.port)
        idle = []
        for _ in range(args.idle):
            idle.append(socket.create_connection(address, timeout=30))
        progress(f"{len(idle)} idle connections open")
        fetch = encode(FetchRequest(max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=2**31 - 1, topics=(
            FetchTopic(topic="load", partitions=(FetchPartition(partition=0, fetch_offset=0,
                                                                partition_max_bytes=2**31 - 1),)),),
            forgotten_topics_data=()), 1)
        old_fetch = encode(OldFetchRequest(replica_id=-1, max_wait=timedelta(milliseconds=500), min_bytes=1,
                                           max_bytes=2**31 - 1, topics=(OldFetchTopic(topic="load", partitions=(
                                               OldFetchPartition(partition=0, fetch_offset=0,
                                                                 partition_max_bytes=2**31 - 1),)),)), 1)
        stuck = []
        for request in [fetch] * args.stuck + [old_fetch] * args.stuck_old:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(address)
            sock.sendall(request)
            stuck.append(sock)
        progress(f"{len(stuck)} stuck consumers sent their fetch")
        peak = [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(handle.pid))
                time.sleep(0.2)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        loaded = _latencies(handle.bootstrap, args.seconds)
        stop.set()
        sampler.join()
        alive = handle.running()
        for sock in idle + stuck:
            sock.close()
        time.sleep(3)
        rss_after = _rss(handle.pid) if alive else 0
        handle.stop()
        log = handle.read_stderr()
        lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
        steps = re.findall(r"event loop: longest single steps: (.*); longest garbage collections: (.*)", log)
        rows = [
            ("idle connections", args.idle),
            ("stuck consumers (fetch 2 GiB, never read)", args.stuck),
            ("stuck consumers sending Fetch v3 (down-converted)", args.stuck_old),
            ("data in the fetched partition (MB)", args.fill_mb),
            ("broker alive", alive),
            ("RSS before (MiB)", rss_before >> 20),
            ("RSS peak under load (MiB)", peak[0] >> 20),
            ("RSS after closing them (MiB)", rss_after >> 20),
            ("bystander produce, quiet", _percentiles(quiet)),
            ("bystander produce, under load", _percentiles(loaded)),
            ("broker's worst event-loop lag: wall / own CPU (ms)", " / ".join(lag[-1]) if lag else "?"),
            ("longest single steps, by request (broker CPU)", steps[-1][0] if steps else "?"),
            ("longest garbage collections", steps[-1][1] if steps else "?"),
        ]
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
