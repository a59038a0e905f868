"""The network layer over a real socket pair: what a response write does when the peer is gone."""

import asyncio
import gc
import logging
import socket
import weakref
from datetime import timedelta

from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

from ottla.config import BrokerConfig
from ottla.protocol.build import make
from ottla.protocol.schemas import request_schema
from ottla.server.broker import Broker
from ottla.server.network import Connection
from ottla.testing.fuzz import encode


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


def _freed_without_the_garbage_collector(tmp_path, which: int) -> bool:
    """Accepts a connection and closes its peer with the garbage collector off: whether the
    transport (0) or the `Connection` (1) is gone all the same."""

    async def scenario():
        ours, theirs = socket.socketpair()
        broker = Broker(tmp_path, BrokerConfig({}))
        accepted = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
        await asyncio.sleep(0)  # connection_made
        gone = weakref.ref(accepted[which])
        del accepted
        theirs.close()
        for _ in range(5):
            await asyncio.sleep(0)  # EOF, connection_lost, the cancelled loop ends
        broker.logs.close()
        return gone

    gc.disable()
    try:
        return asyncio.run(scenario())() is None
    finally:
        gc.enable()


def test_a_closed_connection_is_freed_without_the_garbage_collector(tmp_path):
    """Its cancelled request loop keeps a CancelledError whose traceback holds the connection:
    while the connection still referred to that task, each closed one was cyclic garbage (5,000
    of them lingered until a full collection)."""
    assert _freed_without_the_garbage_collector(tmp_path, 1)


def test_a_closed_transport_is_freed_without_the_garbage_collector(tmp_path):
    """Python 3.11's socket transport refers to itself through a bound method: every closed
    connection left its transport and socket as cyclic garbage, and after a storm of closes
    the full collection that freed them held the event loop for hundreds of milliseconds."""
    assert _freed_without_the_garbage_collector(tmp_path, 0)


def test_a_connection_closed_during_a_long_poll_is_freed_without_the_garbage_collector(tmp_path):
    """A fetch waiting for data when its client leaves is cancelled; the cancellation came back
    out through the loop-hold wrapper, whose frame kept the exception, and the exception's
    traceback holds that frame: the request's frames, the request and the connection (about 50
    objects) waited for a full collection."""

    async def scenario():
        ours, theirs = socket.socketpair()
        broker = Broker(tmp_path, BrokerConfig({}))
        broker.create_topic("t", 1, {})
        _, connection = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
        theirs.sendall(encode(FetchRequest(max_wait=timedelta(seconds=60), min_bytes=1, max_bytes=1 << 20, topics=(
            FetchTopic(topic="t", partitions=(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
            forgotten_topics_data=()), 1))
        for _ in range(500):
            if broker.replicas.delayed_fetches.watching(("t", 0)):
                break
            await asyncio.sleep(0.01)
        assert broker.replicas.delayed_fetches.watching(("t", 0)) == 1  # the fetch waits for data
        gone = weakref.ref(connection)
        del connection
        theirs.close()
        for _ in range(5):
            await asyncio.sleep(0)  # EOF, connection_lost, the cancelled fetch ends
        assert broker.replicas.delayed_fetches.watching(("t", 0)) == 0
        broker.logs.close()
        return gone

    gc.disable()
    try:
        gone = asyncio.run(scenario())
        assert gone() is None
    finally:
        gc.enable()


def test_a_waiting_long_poll_holds_few_objects_for_the_collector(tmp_path):
    """A full garbage collection walks every object of every request in flight: 5,000 waiting
    fetches at 42 tracked objects each (a timeout context and its timer, the first empty
    answer, bound methods and closures of the request loop) made one take 70-90 ms of the
    loop's CPU. What each waiting fetch adds is now at most 28 (25-26 measured)."""
    polls = 100

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        broker.create_topic("t", 1, {})
        loop = asyncio.get_running_loop()
        clients = []
        for _ in range(polls):
            ours, theirs = socket.socketpair()
            await loop.connect_accepted_socket(lambda: Connection(broker), ours)
            clients.append(theirs)
        await asyncio.sleep(0.05)
        gc.collect()
        gc.freeze()  # what is there before the fetches arrive
        try:
            for theirs in clients:
                theirs.sendall(encode(FetchRequest(max_wait=timedelta(seconds=60), min_bytes=1, max_bytes=1 << 20,
                                                   topics=(FetchTopic(topic="t", partitions=(FetchPartition(
                                                       partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
                                                   forgotten_topics_data=()), 1))
            for _ in range(500):
                if all(connection.handling for connection in broker.connections):
                    break
                await asyncio.sleep(0.01)
            assert len(broker.connections) == polls and all(connection.handling for connection in broker.connections)
            gc.collect()
            per_fetch = len(gc.get_objects()) / polls
        finally:
            gc.unfreeze()
            for theirs in clients:
                theirs.close()
            await asyncio.sleep(0.05)
            broker.logs.close()
        assert per_fetch <= 28, per_fetch

    asyncio.run(scenario())


def test_idle_connections_hold_no_task_and_requests_are_answered_in_order(tmp_path):
    """Each connection kept a request loop task waiting for its next request: a dozen objects a
    connection that every full garbage collection walks (5,000 idle connections). Now a task
    exists only while requests are queued; pipelined requests are still answered in order, and
    a request after the queue ran dry starts a new one."""

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        await broker.start()
        try:
            before = len(asyncio.all_tasks())
            streams = [await asyncio.open_connection("127.0.0.1", broker.port) for _ in range(20)]
            while len(broker.connections) < 20:
                await asyncio.sleep(0.01)
            await _tasks_settle(before)  # the acceptor's set-up tasks end
            assert len(asyncio.all_tasks()) == before
            reader, writer = streams[0]
            api_versions = make(request_schema(18, 3), client_software_name="t", client_software_version="1")
            writer.write(b"".join(encode(api_versions, correlation_id) for correlation_id in (1, 2, 3)))
            assert [await _correlation_id(reader) for _ in range(3)] == [1, 2, 3]
            await _tasks_settle(before)  # the worker ends once nothing is queued
            assert len(asyncio.all_tasks()) == before
            writer.write(encode(api_versions, 4))
            assert await _correlation_id(reader) == 4
            for _, writer in streams:
                writer.close()
        finally:
            await broker.stop()

    asyncio.run(scenario())


async def _correlation_id(reader: asyncio.StreamReader) -> int:
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 30), "big")
    return int.from_bytes((await reader.readexactly(size))[:4], "big")


async def _tasks_settle(count: int) -> None:
    for _ in range(200):
        if len(asyncio.all_tasks()) <= count:
            return
        await asyncio.sleep(0.01)


def test_connections_that_stay_are_out_of_the_full_collections_walk(tmp_path):
    """A full garbage collection walks every tracked object: 5,000 open connections made each
    take tens of ms of the loop's CPU. Once the open connections have grown by a step, they
    are frozen out of the collector's generations; closed, they are still freed."""

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        broker.connections.freeze_step = 8
        await broker.start()
        try:
            streams = [await asyncio.open_connection("127.0.0.1", broker.port) for _ in range(12)]
            while len(broker.connections) < 12:
                await asyncio.sleep(0.01)
            walked = {id(o) for o in gc.get_objects()}  # what a full collection walks
            first = min(broker.connections, key=lambda connection: int(connection.id[1:]))
            assert id(first) not in walked
            gone = weakref.ref(first)
            del first
            for _, writer in streams:
                writer.close()
            while len(broker.connections):
                await asyncio.sleep(0.01)
            return gone
        finally:
            await broker.stop()

    gc.disable()
    try:
        gone = asyncio.run(scenario())
        assert gone() is None  # frozen, and freed all the same
    finally:
        gc.unfreeze()
        gc.enable()
