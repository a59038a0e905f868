"""The network layer over a real socket pair: what a response write does when the peer is gone."""

import asyncio
import logging
import socket

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
