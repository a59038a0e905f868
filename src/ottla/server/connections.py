"""What all connections together may hold: Kafka's connection quotas, idle expiry and request memory pool.

- `max.connections` / `max.connections.per.ip`: a connection over either limit is closed as
  soon as it is accepted (Kafka rejects per-IP overflow the same way; for the broker-wide
  limit Kafka stops accepting until a slot frees, which Ottla's acceptor does not do, so the
  newcomer is closed instead and the client retries).
- `connections.max.idle.ms`: a connection with no handler at work and no bytes moved in
  either direction for that long is closed, as Kafka's selector does (a response the peer
  does not read counts as idle).
- `queued.max.request.bytes`: Kafka's memory pool. Before a frame is read, its declared
  size is reserved; while the reserved total is at or above the bound, no connection
  starts reading a new frame (reading pauses) until handled requests give their
  reservation back. Frames already admitted complete, so this cannot deadlock. -1, Kafka's
  default, leaves it unbounded; the buffers themselves grow only as bytes arrive.
- `socket.send.buffer.bytes` / `socket.receive.buffer.bytes` (Kafka's, 100 KiB; -1 leaves
  the OS's autotuning): the kernel buffers of each connection. Left to Linux's autotuning a
  send buffer grows to 4 MiB, so a consumer that does not read pinned that much kernel memory
  and the loop spent the CPU copying it there: 200 of them held every client for 6 s. The
  100 KiB receive buffer costs a 1 MB produce request 8 reads and window updates instead of 2
  (about 6% of the broker's CPU per MB, `benchmarks/receive_path.py`); kept, as Kafka keeps it,
  for the bound it puts on what a paused connection holds in the kernel.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from typing import TYPE_CHECKING, Iterator

from .heap import FREEZE_STEP, freeze_long_lived

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from .network import Connection

log = logging.getLogger("ottla.network")


def size_socket_buffers(listening: "list[socket.socket]", config: "BrokerConfig") -> None:
    """Set the listening sockets' kernel buffers, which the connections they accept inherit
    (Kafka sets the receive buffer on its server socket and the send buffer per connection)."""
    for option, name in ((socket.SO_SNDBUF, "socket.send.buffer.bytes"),
                         (socket.SO_RCVBUF, "socket.receive.buffer.bytes")):
        size = config[name]
        if size != -1:
            for sock in listening:
                sock.setsockopt(socket.SOL_SOCKET, option, size)


class RequestMemory:
    """Kafka's SimpleMemoryPool in non-strict mode: a reservation succeeds while anything is left."""

    def __init__(self, bound: int):
        self.bound = bound
        self.reserved = 0
        self._waiting: dict["Connection", None] = {}

    def try_reserve(self, size: int) -> bool:
        if 0 <= self.bound <= self.reserved:
            return False
        self.reserved += size
        return True

    def release(self, size: int) -> None:
        self.reserved -= size
        if self._waiting and not 0 <= self.bound <= self.reserved:
            waiting, self._waiting = self._waiting, {}
            for connection in waiting:
                connection.memory_available()

    def wait(self, connection: "Connection") -> None:
        self._waiting[connection] = None

    def forget(self, connection: "Connection") -> None:
        self._waiting.pop(connection, None)


class Connections:
    """The broker's open connections and the limits that apply to them together."""

    def __init__(self, config: "BrokerConfig"):
        self.reconfigure(config)
        self.idle_ms = config["connections.max.idle.ms"]
        self.memory = RequestMemory(config["queued.max.request.bytes"])
        self._open: set["Connection"] = set()
        self._per_ip: Counter[str] = Counter()
        self.closed_since_release = 0  # see heap.release_after_connection_storms
        self.freeze_step = FREEZE_STEP
        self._frozen_at = 0  # open connections at the last heap.freeze_long_lived

    def reconfigure(self, config: "BrokerConfig") -> None:
        """The limits (dynamic broker configs) apply to connections accepted from now on."""
        self.max_connections = config["max.connections"]
        self.max_per_ip = config["max.connections.per.ip"]

    def add(self, connection: "Connection") -> str | None:
        """Register a new connection, or say why it must be closed."""
        host = connection.peer_host
        if self._per_ip[host] >= self.max_per_ip:
            return f"address already has the configured maximum of {self.max_per_ip} connections (max.connections.per.ip)"
        if len(self._open) >= self.max_connections:
            return f"broker already has the configured maximum of {self.max_connections} connections (max.connections)"
        self._open.add(connection)
        self._per_ip[host] += 1
        if len(self._open) >= self._frozen_at + self.freeze_step:
            freeze_long_lived()
            self._frozen_at = len(self._open)
        return None

    def discard(self, connection: "Connection") -> None:
        if connection in self._open:
            self._open.remove(connection)
            self.closed_since_release += 1
            self._frozen_at = min(self._frozen_at, len(self._open))
            self._per_ip[connection.peer_host] -= 1
            if not self._per_ip[connection.peer_host]:
                del self._per_ip[connection.peer_host]
        self.memory.forget(connection)

    def __iter__(self) -> Iterator["Connection"]:
        return iter(self._open)

    def __len__(self) -> int:
        return len(self._open)

    async def expire_idle(self) -> None:
        """Close connections idle for connections.max.idle.ms (checked a few times per period)."""
        period_s = self.idle_ms / 1000
        while True:
            await asyncio.sleep(min(max(period_s / 4, 0.05), 30.0))
            deadline = time.monotonic() - period_s
            for connection in [c for c in self._open if c.idle_since(deadline)]:
                log.info("closing connection %s from %s: idle for more than %d ms (connections.max.idle.ms)",
                         connection.id, connection.peer, self.idle_ms)
                connection.close()
