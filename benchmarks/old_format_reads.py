"""Fetch v0-3 down-conversion, in process: what the event loop's thread reads from the disk
and how often a batch is decompressed for one response (issue 11).

    PYTHONPATH=src python benchmarks/old_format_reads.py

Two cases, each on a real broker's log whose pages are dropped from the page cache first
(posix_fadvise DONTNEED): "cold" is 800 uncompressed batches of one 10 KB record, "split"
one zstd batch of 32,768 records inflating to 32 MiB (converted by groups of its records).
The response is sized as the Fetch v3 handler does (`down_converted`) and sent through a
real Connection to a socket a thread drains. Prints the preads made on the loop's thread
(RWF_NOWAIT preadv of cached pages is not one), the decompressions and the process CPU.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from ottla.config import BrokerConfig
from ottla.records import legacy
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.network import Connection


def _fill(broker: Broker, case: str) -> None:
    if case == "cold":
        for n in range(800):
            broker.replicas.append("t", 0, build_batch([Record(b"k", bytes([n % 256]) * 10_000, (), now_ms())]),
                                   now_ms=now_ms())
    else:
        records = [Record(b"k%d" % i, os.urandom(50) * 20, (), now_ms()) for i in range(32 * 1024)]
        broker.replicas.append("t", 0, build_batch(records, compression="zstd"), now_ms=now_ms())


def run(case: str) -> dict:
    ours, theirs = socket.socketpair()
    threading.Thread(target=lambda: [None for _ in iter(lambda: theirs.recv(1 << 20), b"")], daemon=True).start()
    row: dict = {}

    async def scenario():
        broker = Broker(Path(tempfile.mkdtemp(prefix="old-format-reads-")), BrokerConfig({}))
        loop_thread = threading.get_ident()
        broker.create_topic("t", 1, {"max.message.bytes": str(8 << 20)})
        _fill(broker, case)
        log = broker.logs.get_log("t", 0)
        log.flush()
        records = log.read(0, 64 << 20, max_offset=log.log_end_offset, lazy=True).records
        with open(log.segments[0].log_path, "rb") as segment:
            os.posix_fadvise(segment.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        on_loop = [0, 0.0]
        decompressions = [0]
        real_pread, real_decompress = os.pread, legacy.decompress

        def pread(fd, length, offset):
            started = time.perf_counter()
            try:
                return real_pread(fd, length, offset)
            finally:
                if threading.get_ident() == loop_thread:
                    on_loop[0] += 1
                    on_loop[1] += time.perf_counter() - started

        def decompress(codec, data):
            decompressions[0] += 1
            return real_decompress(codec, data)
        os.pread, legacy.decompress = pread, decompress
        try:
            cpu = time.process_time()
            lazy = await legacy.down_converted(records, 1, lambda: asyncio.sleep(0))
            row["walk: CPU ms"] = (time.process_time() - cpu) * 1000
            row["walk: preads on the loop / ms in them"] = f"{on_loop[0]} / {on_loop[1] * 1000:.1f}"
            row["walk: decompressions"] = decompressions[0]
            _, connection = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
            cpu = time.process_time()
            await connection._send([lazy])
            row["send: CPU ms"] = (time.process_time() - cpu) * 1000
            row["all: preads on the loop / ms in them"] = f"{on_loop[0]} / {on_loop[1] * 1000:.1f}"
            row["all: decompressions"] = decompressions[0]
            row["groups / MB sent"] = f"{len(lazy.groups)} / {len(lazy) / 1e6:.1f}"
            connection.close()
            await asyncio.sleep(0)
        finally:
            os.pread, legacy.decompress = real_pread, real_decompress
            broker.logs.close()
            broker.release_data_dir()
    asyncio.run(scenario())
    return row


def main() -> None:
    rows = {case: run(case) for case in ("cold", "split")}
    print(f"{'':40} {'cold':>14} {'split':>14}")
    for name in rows["cold"]:
        cells = [rows[case][name] for case in rows]
        print(f"{name:40} " + " ".join(f"{c:>14.1f}" if isinstance(c, float) else f"{c!s:>14}" for c in cells))


if __name__ == "__main__":
    main()
