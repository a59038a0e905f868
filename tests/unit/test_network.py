"""The network layer over a real socket pair: what a response write does when the peer is gone."""

import asyncio
import gc
import logging
import socket
import weakref

from ottla.config import BrokerConfig
from ottla.server.broker import Broker
from ottla.server.network import Connection


def test_response_to_a_departed_peer_stops_at_the_first_failed_write(tmp_path, caplog):
    """A client that leaves while a multi-MB fetch response is going out: the broker stops
    writing it at once instead of offering asyncio every remaining slice (asyncio logs a
    warning for each write after the connection was lost)."""

    async def scenario():
        ours, theirs = socket.socketpair()
        broker = Broker(tmp_path, BrokerConfig({}))
        transport, connection = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: Connection(broker), ours)
        theirs.close()
        await connection._send([b"\0" * (32 << 20)])
        assert transport.is_closing()
        await asyncio.sleep(0)  # connection_lost runs
        assert connection.closed and connection not in broker.connections
        broker.logs.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_closed_connection_is_freed_without_the_garbage_collector(tmp_path):
    """Its cancelled request loop keeps a CancelledError whose traceback holds the connection:
    while the connection still referred to that task, each closed one was cyclic garbage (5,000
    of them lingered until a full collection)."""

    async def scenario():
        ours, theirs = socket.socketpair()
        broker = Broker(tmp_path, BrokerConfig({}))
        _, connection = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
        await asyncio.sleep(0)  # the request loop waits for a request
        gone = weakref.ref(connection)
        del connection
        theirs.close()
        for _ in range(5):
            await asyncio.sleep(0)  # EOF, connection_lost, the cancelled loop ends
        broker.logs.close()
        return gone

    gc.disable()
    try:
        gone = asyncio.run(scenario())
        assert gone() is None
    finally:
        gc.enable()


def test_a_closed_transport_is_freed_without_the_garbage_collector(tmp_path):
    """Python 3.11's socket transport refers to itself through a bound method: every closed
    connection left its transport and socket as cyclic garbage, and after a storm of closes
    the full collection that freed them held the event loop for hundreds of milliseconds."""

    async def scenario():
        ours, theirs = socket.socketpair()
        broker = Broker(tmp_path, BrokerConfig({}))
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
        await asyncio.sleep(0)
        gone = weakref.ref(transport)
        del transport
        theirs.close()
        for _ in range(5):
            await asyncio.sleep(0)  # EOF, connection_lost
        broker.logs.close()
        return gone

    gc.disable()
    try:
        gone = asyncio.run(scenario())
        assert gone() is None
    finally:
        gc.enable()

