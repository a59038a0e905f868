"""A single node makes a new topic's or partition's directories off the event loop (issue 11):
one CreateTopics or CreatePartitions may ask for 10,000 partitions, seconds of directory,
segment and fsync work (7.5 s for 10,000 here), during which no other client was served.
In process: a real broker on real files, the requests over a socket; os.mkdir is observed,
not replaced."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from datetime import timedelta

from kio.schema.create_partitions.v3.request import CreatePartitionsRequest, CreatePartitionsTopic
from kio.schema.create_partitions.v3.response import CreatePartitionsResponse
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.create_topics.v7.response import CreateTopicsResponse

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.protocol.codec import decode_response
from ottla.server.broker import Broker
from ottla.server.network import Connection
from ottla.testing.fuzz import encode

PARTITIONS = 200


def _topic(name: str) -> CreatableTopic:
    return CreatableTopic(name=name, num_partitions=PARTITIONS, replication_factor=1, assignments=(), configs=())


async def _answer(reader: asyncio.StreamReader, response_type):
    size, = struct.unpack(">i", await reader.readexactly(4))
    return decode_response(await reader.readexactly(size), response_type.__api_key__, response_type.__version__)[1]


def test_large_creations_make_their_directories_while_the_loop_serves_others(tmp_path, monkeypatch):
    made_on_loop: list[str] = []
    ticks_while_waiting: list[int] = []

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        loop_thread = threading.get_ident()
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if threading.get_ident() == loop_thread and "-" in os.path.basename(str(path)):
                made_on_loop.append(str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
        ours, theirs = socket.socketpair()
        await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
        reader, writer = await asyncio.open_connection(sock=theirs)
        ticks = 0

        async def another_client():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        others = asyncio.ensure_future(another_client())
        try:
            # Two creations of one name in one request's wake: the second waits for the first.
            writer.write(encode(CreateTopicsRequest(topics=(_topic("t"),), timeout=timedelta(seconds=30),
                                                    validate_only=False), 1))
            writer.write(encode(CreateTopicsRequest(topics=(_topic("t"),), timeout=timedelta(seconds=30),
                                                    validate_only=False), 2))
            before = ticks
            first = await _answer(reader, CreateTopicsResponse)
            second = await _answer(reader, CreateTopicsResponse)
            writer.write(encode(CreatePartitionsRequest(
                topics=(CreatePartitionsTopic(name="t", count=2 * PARTITIONS, assignments=None),),
                timeout=timedelta(seconds=30), validate_only=False), 3))
            grown = await _answer(reader, CreatePartitionsResponse)
            ticks_while_waiting.append(ticks - before)
            assert [t.error_code for t in first.topics] == [ErrorCode.none]
            assert [t.error_code for t in second.topics] == [ErrorCode.topic_already_exists]
            assert [t.error_code for t in grown.results] == [ErrorCode.none]
            assert broker.metadata.topic("t").partition_count == 2 * PARTITIONS
            assert len([d for d in tmp_path.iterdir() if d.name.startswith("t-")]) == 2 * PARTITIONS
        finally:
            others.cancel()
            writer.close()
            monkeypatch.undo()
            broker.logs.close()
            broker.release_data_dir()

    asyncio.run(scenario())
    assert made_on_loop == [], made_on_loop[:5]
    assert ticks_while_waiting[0] > 0
