"""Accepting connections a slice at a time, so that many arriving at once do not hold the loop.

asyncio's own server accepts, in one callback, as many connections as its listen backlog
(1,024 here), and sets every one of them up in the same next loop iterations: 5,000
connections opened at once held the event loop for up to 84 ms of CPU between two
wake-ups of the lag probe (docs/performance.md, "Accept storms"). Here each listening
socket has a task that accepts at most `ACCEPT_SLICE` connections, hands each to asyncio's
`connect_accepted_socket` and yields before the next slice, so every loop iteration sets
up a bounded number of them. The kernel's backlog is unchanged: what waits is queued there.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Callable

log = logging.getLogger("ottla.network")

ACCEPT_SLICE = 16
LISTEN_BACKLOG = 1024
# Out of descriptors or memory: asyncio pauses accepting for a second too.
_RETRY_AFTER_S = 1.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


async def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address `host` resolves to, as `loop.create_server` binds
    them (SO_REUSEADDR; an IPv6 socket only for IPv6)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listening: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listening.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, True)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address {address!r}: "
                                         f"{exc.strerror.lower()}") from None
            sock.setblocking(False)
    except BaseException:
        for sock in listening:
            sock.close()
        raise
    return listening


class Acceptor:
    """Serves `protocol_factory` connections on `listening` (bound sockets) from `start()` on."""

    def __init__(self, listening: list[socket.socket], protocol_factory: Callable[[], asyncio.BaseProtocol]):
        self.sockets = listening
        self._factory = protocol_factory
        self._tasks: list[asyncio.Task] = []
        self._setting_up: set[asyncio.Task] = set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            sock.listen(LISTEN_BACKLOG)
            self._tasks.append(loop.create_task(self._accept(sock)))

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections already made stay)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        for sock in self.sockets:
            sock.close()

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                accepted = [(await loop.sock_accept(sock))[0]]  # waits for the first one
                while len(accepted) < ACCEPT_SLICE:
                    try:
                        accepted.append(sock.accept()[0])
                    except (BlockingIOError, InterruptedError):
                        break
            except ConnectionAbortedError:
                continue  # the peer gave up while it was queued
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                log.warning("cannot accept connections on %s: %s; trying again in %.0f s",
                            sock.getsockname(), exc, _RETRY_AFTER_S)
                await asyncio.sleep(_RETRY_AFTER_S)
                continue
            for conn in accepted:
                setup = loop.create_task(loop.connect_accepted_socket(self._factory, conn))
                self._setting_up.add(setup)
                setup.add_done_callback(self._set_up)
            await asyncio.sleep(0)  # the loop runs what is ready before the next slice

    def _set_up(self, setup: asyncio.Task) -> None:
        self._setting_up.discard(setup)
        if not setup.cancelled() and setup.exception() is not None:
            # The peer left before its transport was made (asyncio logs these at debug too).
            log.debug("a connection ended while it was being set up: %r", setup.exception())
