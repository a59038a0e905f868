"""What single hostile requests from issue 11 cost the broker now: RSS, response size, time, loop lag.

    .venv/bin/python benchmarks/hostile_requests.py

- 10 connections each declaring a 100 MB frame and sending 12 bytes (F7): RSS growth.
- DescribeConfigs naming the broker 50,000 times (F3): response size, round trip, and the
  broker's worst event-loop lag over the run, and the requests with the longest single step.
- Fetch naming one partition (10 MB of data) 100 times (F3): response size.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource  # noqa: E402
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic  # noqa: E402

from ottla.testing import broker  # noqa: E402
from ottla.testing.fuzz import _read_frame, encode  # noqa: E402


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _roundtrip(address, request) -> tuple[int, float]:
    with socket.create_connection(address, timeout=300) as sock:
        started = time.monotonic()
        sock.sendall(encode(request, 1))
        frame = _read_frame(sock)
        return len(frame), time.monotonic() - started


def main() -> int:
    rows = []
    with broker(log_level="info") as handle:
        address = (handle.host, handle.port)
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(60)
        producer = Producer({"bootstrap.servers": handle.bootstrap, "linger.ms": 20})
        for _ in range(1000):
            producer.produce("t", b"v" * 10_000)
        producer.flush(60)

        before = _rss(handle.pid)
        liars = [socket.create_connection(address) for _ in range(10)]
        for sock in liars:
            sock.sendall(struct.pack(">i", 100_000_000) + bytes(12))
        _roundtrip(address, DescribeConfigsRequest(resources=()))  # the liars' bytes have been read
        rows.append(("10 x (100 MB declared, 12 B sent): RSS growth (MiB)", f"{(_rss(handle.pid) - before) / 2**20:.1f}"))
        for sock in liars:
            sock.close()

        size, seconds = _roundtrip(address, DescribeConfigsRequest(resources=tuple(
            DescribeConfigsResource(resource_type=4, resource_name="0", configuration_keys=None)
            for _ in range(50_000))))
        rows.append(("DescribeConfigs x 50,000 broker: response bytes", size))
        rows.append(("DescribeConfigs x 50,000 broker: round trip (s)", f"{seconds:.2f}"))

        size, seconds = _roundtrip(address, FetchRequest(max_wait=timedelta(0), min_bytes=0, topics=(FetchTopic(
            topic="t", partitions=tuple(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1)
                                        for _ in range(100))),), forgotten_topics_data=()))
        rows.append(("Fetch naming 1 partition (10 MB) 100 times: response bytes", size))
        handle.stop()
        lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", handle.read_stderr())
        rows.append(("broker's worst event-loop lag over the run: wall / own CPU (ms)", " / ".join(lag[-1])))
        steps = re.findall(r"event loop: longest single steps: (.*); longest garbage collections: (.*)",
                           handle.read_stderr())
        rows.append(("longest single steps, by request (broker CPU)", steps[-1][0]))
        rows.append(("longest garbage collections", steps[-1][1]))
        handle.start()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
