"""Many connections arriving at once are taken a slice per loop iteration, all of them served."""

import asyncio
import socket

from ottla.config import BrokerConfig
from ottla.protocol.build import make
from ottla.protocol.schemas import request_schema
from ottla.server.acceptor import ACCEPT_SLICE
from ottla.server.broker import Broker
from ottla.testing.fuzz import encode

STORM = 5 * ACCEPT_SLICE


def test_a_connection_storm_is_accepted_a_slice_per_loop_iteration(tmp_path):
    """asyncio's server took up to its listen backlog (1,024) in one callback and set them all
    up in the same loop iterations: a storm held every client. Here the connections the broker
    registers between two consecutive loop iterations stay within one slice, and every one of
    the storm's connections is registered and answers a request."""

    async def scenario():
        loop = asyncio.get_running_loop()
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        await broker.start()
        try:
            registered, done = [], loop.create_future()

            def tick():  # runs once per loop iteration
                registered.append(len(broker.connections))
                if len(broker.connections) >= STORM:
                    done.set_result(None)
                else:
                    loop.call_soon(tick)

            clients = []
            for _ in range(STORM):  # all in the kernel's accept queue before the broker looks
                client = socket.socket()
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", broker.port))
                clients.append(client)
            loop.call_soon(tick)
            await asyncio.wait_for(done, 60)
            steps = [after - before for before, after in zip(registered, registered[1:])]
            assert max(steps) <= ACCEPT_SLICE, steps
            # Every one of them is a working connection: ApiVersions on the last one made.
            reader, writer = await asyncio.open_connection(sock=clients[-1])
            writer.write(encode(make(request_schema(18, 3), client_software_name="t",
                                     client_software_version="1"), 7))
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 30), "big")
            answer = await reader.readexactly(size)
            assert int.from_bytes(answer[:4], "big") == 7
            writer.close()
            for client in clients[:-1]:
                client.close()
        finally:
            await broker.stop()

    asyncio.run(scenario())
