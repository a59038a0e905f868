"""What single hostile requests from issue 11 cost the broker now: RSS, response size, time, loop lag.

    .venv/bin/python benchmarks/hostile_requests.py

- 10 connections each declaring a 100 MB frame and sending 12 bytes (F7): RSS growth.
- DescribeConfigs naming the broker 50,000 times (F3): response size, round trip, and the
  broker's worst event-loop lag over the run, and the requests with the longest single step.
- Fetch naming one partition (10 MB of data) 100 times (F3): response size.

    .venv/bin/python benchmarks/hostile_requests.py --bombs 2

--bombs N: only compressed bombs (F3), on a broker of its own with max.message.bytes 8 MB (so
the bound is 32 x 8 MB inflated): N Produce v9 each of a gzip, zstd and lz4 batch of zeros
inflating to 512 MiB and a valid zstd batch of 200,000 records, to a topic keeping the
producer's codec and to one recompressing to lz4, one at a time, while a bystander sends ApiVersions v0 one after the other on its own
connection. Prints each bomb's answer and round trip, the bystander's round trips during the
bombs (count, median, worst), and the broker's longest single Produce step and worst lag.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import struct
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cramjam  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource  # noqa: E402
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic  # noqa: E402

from ottla.records import compression  # noqa: E402
from ottla.records.batch import CRC_OFFSET, HEADER, HEADER_SIZE, LOG_OVERHEAD, compute_crc  # noqa: E402
from ottla.records.records import Record, build_batch  # noqa: E402
from ottla.testing import broker  # noqa: E402
from ottla.testing.fuzz import _read_frame, encode  # noqa: E402
from ottla.testing.fuzz_batches import partition_error, produce_request  # noqa: E402


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


_BOMB_MAX_MESSAGE_BYTES = 8 << 20
_BOMB_CODECS = {"gzip": (compression.GZIP, lambda: cramjam.gzip.Compressor(level=9)),
                "zstd": (compression.ZSTD, lambda: cramjam.zstd.Compressor()),
                "lz4": (compression.LZ4, lambda: cramjam.lz4.Compressor())}


def _bomb(codec: str, inflated: int) -> bytes:
    """A v2 batch with a valid header and CRC whose records section is `inflated` zero bytes
    compressed with `codec` (streamed: the zeros are never held whole)."""
    codec_id, compressor = _BOMB_CODECS[codec]
    stream, zeros = compressor(), bytes(1 << 20)
    for _ in range(inflated >> 20):
        stream.compress(zeros)
    body = bytes(stream.finish())
    fields = list(HEADER.unpack_from(build_batch([Record(b"k", b"v", (), 1_000)]), 0))
    fields[1], fields[5] = HEADER_SIZE + len(body) - LOG_OVERHEAD, codec_id
    batch = bytearray(HEADER.pack(*fields) + body)
    struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


def _bystander(address, stop: threading.Event, seconds: list[float]) -> None:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest
    with socket.create_connection(address, timeout=300) as sock:
        frame = encode(ApiVersionsRequest(), 1)
        while not stop.is_set():
            started = time.monotonic()
            sock.sendall(frame)
            _read_frame(sock)
            seconds.append(time.monotonic() - started)


def bombs(rounds: int) -> int:
    made = {f"{codec} (512 MiB of zeros)": _bomb(codec, 512 << 20) for codec in _BOMB_CODECS}
    # Valid, and large: the Python walk (and, to the recompressing topic, the rebuild) holds the GIL.
    made["zstd, 200,000 valid records (21 MB)"] = build_batch(
        [Record(b"k%d" % i, b"v" * 100, (), 1_000) for i in range(200_000)], compression="zstd")
    config = {"message.max.bytes": _BOMB_MAX_MESSAGE_BYTES}
    print("| bomb | topic | request bytes | answer | round trip s |\n|---|---|---:|---|---:|")
    with broker(config, log_level="info") as handle:
        address = (handle.host, handle.port)
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        for name, configs in (("plain", {}), ("recompress", {"compression.type": "lz4"})):
            admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(60)
        stop, bystander = threading.Event(), []
        thread = threading.Thread(target=_bystander, args=(address, stop, bystander))
        thread.start()
        try:
            with socket.create_connection(address, timeout=300) as sock:
                for _ in range(rounds):
                    for codec, batch in made.items():
                        for topic in ("plain", "recompress"):
                            frame = encode(produce_request(batch, 9, topic), 1)
                            started = time.monotonic()
                            sock.sendall(frame)
                            answer = partition_error(_read_frame(sock), 9)
                            print(f"| {codec} | {topic} | {len(frame):,} | {answer.name.upper()} "
                                  f"| {time.monotonic() - started:.2f} |")
        finally:
            stop.set()
            thread.join()
        handle.stop()
        stderr = handle.read_stderr()
        handle.start()
    for line in stderr.splitlines():
        if "event loop" in line or "held" in line:
            print(line, file=sys.stderr)  # each new worst, timestamped
    ms = sorted(s * 1000 for s in bystander)
    print(f"\nbystander ApiVersions v0 during the bombs: {len(ms)} answered, median {statistics.median(ms):.1f} ms, "
          f"worst {ms[-1]:.0f} ms")
    lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", stderr)
    steps = re.findall(r"event loop: longest single steps: (.*); longest garbage", stderr)
    print(f"broker's worst event-loop lag: {lag[-1][0]} ms wall, {lag[-1][1]} ms of the loop's CPU")
    print(f"longest single steps (loop CPU): {steps[-1]}")
    collections = re.findall(r"longest garbage collections: (.*)", stderr)
    print(f"longest garbage collections: {collections[-1]}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bombs", type=int, default=0, help="only the compressed bombs, N rounds")
    args = parser.parse_args()
    sys.exit(bombs(args.bombs) if args.bombs else main())
