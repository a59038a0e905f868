"""A Produce naming thousands of partitions must not hold the event loop (issue 11, F3): one
of 2.4 MB naming 200,000 partitions held it for 1.9 s of CPU (decoded on the loop, every
partition appended and answered in one step). It is decoded in a worker thread and handled
in steps; a Produce of a few large batches is still decoded on the loop. In process: a real
broker, a real socket pair."""

from __future__ import annotations

import asyncio
import socket
import threading
from datetime import timedelta

import pytest

from kio.schema.produce.v7.request import PartitionProduceData, ProduceRequest, TopicProduceData

from ottla.config import BrokerConfig
from ottla.protocol.codec import decode_request
from ottla.records.records import Record, build_batch
from ottla.server import network
from ottla.server.broker import Broker
from ottla.server.context import RequestContext
from ottla.server.handlers import produce
from ottla.server.network import Connection
from tests.wire import decode_response, encode_request, read_frame

PARTITIONS = 20_000


def _produce(partitions: int, records) -> ProduceRequest:
    return ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=30), topic_data=(TopicProduceData(
        name="x", partition_data=tuple(PartitionProduceData(index=i, records=records) for i in range(partitions))),))


def _empty_topics(topics: int) -> ProduceRequest:
    return ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=30), topic_data=tuple(
        TopicProduceData(name=f"t{i}", partition_data=()) for i in range(topics)))


@pytest.mark.parametrize("request_", [_produce(PARTITIONS, None), _empty_topics(PARTITIONS)],
                         ids=["one topic, many partitions", "many topics, no partitions"])
def test_a_produce_naming_many_partitions_is_read_and_answered_in_steps(tmp_path, request_):
    request = decode_request(encode_request(request_)[4:], {0: (0, 13)})

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            broker.create_topic("x", 1, {})
            turns = 0

            async def other_clients():
                nonlocal turns
                while True:
                    turns += 1
                    await asyncio.sleep(0)
            others = asyncio.create_task(other_clients())
            await asyncio.sleep(0)
            response = await produce.handle(RequestContext(broker, 0, 7, request.header, "c", "127.0.0.1"),
                                            request.body)
            others.cancel()
            return turns, response
        finally:
            broker.logs.close()
            broker.release_data_dir()

    turns, response = asyncio.run(scenario())
    if len(response.responses) == 1:
        (topic,) = response.responses
        assert len(topic.partition_responses) == PARTITIONS
        # Partition 0 exists: its empty record set is refused; the others are not this broker's.
        assert {p.error_code.name for p in topic.partition_responses[1:]} == {"unknown_topic_or_partition"}
    else:
        assert [t.name for t in response.responses] == [f"t{i}" for i in range(PARTITIONS)]
    # 256 entries read, or answered, between two turns of the loop: the others ran.
    assert turns >= 2 * (PARTITIONS // 256)


def test_a_produce_naming_many_partitions_is_decoded_off_the_loop_and_large_batches_on_it(tmp_path, monkeypatch):
    batch = build_batch([Record(b"k", b"v" * 1000, (), -1)] * 500)  # one 500 KB batch
    frames = {"many partitions": encode_request(_produce(PARTITIONS, None), correlation_id=1),
              "one large batch": encode_request(_produce(1, batch), correlation_id=2)}
    decoded_on_loop: dict[str, bool] = {}
    ours, theirs = socket.socketpair()

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        loop_thread = threading.get_ident()

        def observed(frame, supported):
            request = decode_request(frame, supported)
            decoded_on_loop[f"correlation {request.correlation_id}"] = threading.get_ident() == loop_thread
            return request
        monkeypatch.setattr(network, "decode_request", observed)
        try:
            broker.create_topic("x", 1, {})
            await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
            answers = []
            for frame in frames.values():
                await asyncio.to_thread(theirs.sendall, frame)
                answers.append(decode_response(await asyncio.to_thread(read_frame, theirs), 0, 7)[1])
            return answers
        finally:
            theirs.close()
            broker.logs.close()
            broker.release_data_dir()

    many, large = asyncio.run(scenario())
    assert len(many.responses[0].partition_responses) == PARTITIONS
    assert large.responses[0].partition_responses[0].error_code.name == "none"
    assert decoded_on_loop == {"correlation 1": False, "correlation 2": True}
