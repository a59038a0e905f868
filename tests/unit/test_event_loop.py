"""Many connections closing at once are handled a slice of ready sockets per loop iteration."""

import asyncio
import socket

from ottla.config import BrokerConfig
from ottla.server.broker import Broker
from ottla.server.event_loop import new_event_loop

SLICE = 16
STORM = 5 * SLICE


def test_a_disconnect_storm_is_handled_a_slice_per_loop_iteration(tmp_path):
    """asyncio took every ready socket of an epoll wake-up in one iteration: 5,000 clients
    leaving together held every other client while all their ends ran. Here the connections
    the broker drops between two consecutive loop iterations stay within one slice, and all of
    the storm's connections are dropped."""

    async def scenario():
        loop = asyncio.get_running_loop()
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        await broker.start()
        try:
            clients = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(STORM)]
            while len(broker.connections) < STORM:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # every request loop waits for a request
            remaining, done = [], loop.create_future()

            def tick():  # runs once per loop iteration
                remaining.append(len(broker.connections))
                if not broker.connections:
                    done.set_result(None)
                else:
                    loop.call_soon(tick)

            for client in clients:  # all their EOFs are ready before the broker looks
                client.close()
            loop.call_soon(tick)
            await asyncio.wait_for(done, 60)
            steps = [before - after for before, after in zip(remaining, remaining[1:])]
            assert remaining[0] == STORM and max(steps) <= SLICE, remaining
        finally:
            await broker.stop()

    with asyncio.Runner(loop_factory=lambda: new_event_loop(SLICE)) as runner:
        runner.run(scenario())
