"""CPU cost of receiving large requests: the event loop's share of the produce path's reads.

    PYTHONPATH=src .venv/bin/python benchmarks/receive_path.py
    PYTHONPATH=src .venv/bin/python benchmarks/receive_path.py --frames 400 --repeat 5

A sender process writes `--frames` frames of `--frame-bytes` (a size prefix and zeros, as a
1 MB produce request of kcat's arrives) over TCP loopback as fast as the socket takes them;
the receiver is the broker's own event loop (`server/event_loop.py`) and `FrameDecoder`, behind
a listening socket with `socket.receive.buffer.bytes` set as the broker sets it (-1: the OS's
autotuning). What is measured is the loop thread's CPU (time.thread_time) per MB received:
recv calls, the ACKs and window updates the kernel sends from them (their loopback delivery to
the sender runs in the receiver's context), the loop's iterations and the decoder. Handling
the frames is not measured. Compare trees by running it with each on PYTHONPATH; the sizes
alternate within a run. The "floor" rows read into one fixed buffer and count bytes: what
the loop and the kernel cost with no decoder at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

from ottla.protocol.codec import FrameDecoder
from ottla.server.event_loop import new_event_loop
from ottla.server.heap import keep_freed_request_buffers

_SENDER = """
import socket, struct, sys
port, frames, size = map(int, sys.argv[1:4])
frame = struct.pack(">i", size) + bytes(size)
with socket.create_connection(("127.0.0.1", port)) as sock:
    for _ in range(frames):
        sock.sendall(frame)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
"""


class _Receiver(asyncio.BufferedProtocol):
    def __init__(self, frames: int, done: asyncio.Future):
        self.decoder = FrameDecoder(100 * 1024 * 1024)
        self.left, self.done = frames, done
        self.reads = 0
        self.started = None

    def get_buffer(self, sizehint):
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes):
        if self.started is None:
            self.started = time.thread_time()
        self.reads += 1
        self.left -= len(self.decoder.buffer_updated(nbytes))
        if not self.left:
            self.done.set_result((time.thread_time() - self.started, self.reads))

    def eof_received(self):
        return False


class _Floor(_Receiver):
    """Reads into one fixed buffer and counts bytes: no framing."""

    def __init__(self, frames: int, done: asyncio.Future, frame_bytes: int):
        super().__init__(frames, done)
        self.buffer = memoryview(bytearray(256 * 1024))
        self.expected = frames * (4 + frame_bytes)

    def get_buffer(self, sizehint):
        return self.buffer

    def buffer_updated(self, nbytes):
        if self.started is None:
            self.started = time.thread_time()
        self.reads += 1
        self.expected -= nbytes
        if not self.expected:
            self.done.set_result((time.thread_time() - self.started, self.reads))


async def _one(rcvbuf: int, frames: int, size: int, floor: bool) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    if rcvbuf != -1:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    done = loop.create_future()
    protocol = (lambda: _Floor(frames, done, size)) if floor else (lambda: _Receiver(frames, done))
    server = await loop.create_server(protocol, sock=listener)
    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(listener.getsockname()[1]), str(frames), str(size)])
    try:
        return await asyncio.wait_for(done, 120)
    finally:
        server.close()
        sender.kill()
        sender.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--frame-bytes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs per buffer size, alternating; medians")
    parser.add_argument("--rcvbuf", default="102400,-1", help="socket.receive.buffer.bytes values")
    args = parser.parse_args()
    sizes = [int(value) for value in args.rcvbuf.split(",")]
    kinds = [(size, floor) for floor in (False, True) for size in sizes]
    results: dict[tuple[int, bool], list[tuple[float, int]]] = {kind: [] for kind in kinds}
    keep_freed_request_buffers()  # as `ottla serve` does
    loop = new_event_loop()
    try:
        for _ in range(args.repeat):
            for size, floor in kinds:
                results[size, floor].append(loop.run_until_complete(_one(size, args.frames, args.frame_bytes, floor)))
    finally:
        loop.close()
    mb = args.frames * args.frame_bytes / 1e6
    print(f"{args.frames} frames of {args.frame_bytes:,} bytes, {args.repeat} runs each; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| socket.receive.buffer.bytes | receiver | loop CPU ms per MB (median, min-max) | reads per MB |")
    print("| --- | --- | ---: | ---: |")
    for (size, floor), runs in results.items():
        per_mb = [cpu * 1000 / mb for cpu, _ in runs]
        spread = f"{statistics.median(per_mb):.3f} ({min(per_mb):.3f}-{max(per_mb):.3f})"
        print(f"| {size} | {'floor' if floor else 'FrameDecoder'} | {spread} | "
              f"{statistics.median(reads for _, reads in runs) / mb:.1f} |")
    print(f"\n- command: python benchmarks/receive_path.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
