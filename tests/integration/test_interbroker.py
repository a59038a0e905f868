"""The inter-broker client against a real `ottla serve`: pipelined requests matched by
correlation id, a WriteTxnMarkers and a Fetch round trip, timeouts, reconnects and close."""

from __future__ import annotations

import asyncio
import socket
from datetime import timedelta

import pytest
from confluent_kafka import Producer
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
)

from ottla.records.records import iter_batches
from ottla.server.interbroker import BrokerNotAvailable, InterBrokerClient, RequestTimedOut
from ottla.testing import broker


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def fetch_request(topic: str, offset: int) -> FetchRequest:
    return FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=timedelta(milliseconds=0), min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=(),
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1 << 20),)),))


def test_round_trips_against_a_real_broker():
    with broker() as b:
        produce(b.bootstrap, "ib", [b"a", b"b", b"c"])

        async def scenario():
            client = InterBrokerClient("broker-99")
            try:
                # pipelined on one connection: the answers come back matched to their requests
                versions, metadata = await asyncio.gather(
                    client.send(0, b.host, b.port, ApiVersionsRequest(client_software_name="ottla",
                                                                    client_software_version="1")),
                    client.send(0, b.host, b.port, MetadataRequest(
                        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)))
                assert versions.error_code == ErrorCode.none
                assert any(v.api_key == 27 for v in versions.api_keys)  # WriteTxnMarkers is served
                (topic,) = [t for t in metadata.topics if t.name == "ib"]
                assert [(p.partition_index, p.leader_id) for p in topic.partitions] == [(0, metadata.brokers[0].node_id)]

                fetched = await client.send(0, b.host, b.port, fetch_request("ib", 0))
                records = fetched.responses[0].partitions[0].records
                assert [r.value for _, rs in iter_batches(records) for r in rs] == [b"a", b"b", b"c"]

                marker = await client.send(0, b.host, b.port, WriteTxnMarkersRequest(markers=(WritableTxnMarker(
                    producer_id=4242, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
                    topics=(WritableTxnMarkerTopic(name="ib", partition_indexes=(0,)),)),)))
                assert marker.markers[0].topics[0].partitions[0].error_code == ErrorCode.none
                after = await client.send(0, b.host, b.port, fetch_request("ib", 3))
                (header, _), = list(iter_batches(after.responses[0].partitions[0].records))
                assert header.is_control and header.producer_id == 4242 and header.base_offset == 3

                # the broker restarts: the next send reconnects on its own
                b.restart()
                for _ in range(100):
                    try:
                        again = await client.send(0, b.host, b.port, fetch_request("ib", 0))
                        break
                    except BrokerNotAvailable:
                        await asyncio.sleep(0.1)
                assert again.responses[0].partitions[0].error_code == ErrorCode.none
            finally:
                await client.close()
            with pytest.raises(BrokerNotAvailable):
                await client.send(0, b.host, b.port, fetch_request("ib", 0))

        asyncio.run(scenario())


def test_unreachable_and_silent_brokers():
    listener = socket.socket()  # accepts connections but never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    silent_port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there any more

    async def scenario():
        client = InterBrokerClient("broker-1", request_timeout_ms=300, reconnect_backoff_ms=50)
        try:
            with pytest.raises(RequestTimedOut):
                await client.send(5, "127.0.0.1", silent_port, ApiVersionsRequest(
                    client_software_name="ottla", client_software_version="1"))
            with pytest.raises(BrokerNotAvailable):
                await client.send(6, "127.0.0.1", closed_port, ApiVersionsRequest(
                    client_software_name="ottla", client_software_version="1"))
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        listener.close()


def test_a_response_to_no_request_closes_the_connection():
    """Answers are matched by correlation id: one that matches nothing is a broken peer."""
    async def scenario():
        async def answer_wrongly(reader, writer):
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            writer.write((8).to_bytes(4, "big") + (999).to_bytes(4, "big") + bytes(4))
            await writer.drain()
            await reader.read()  # until the client hangs up
            writer.close()

        server = await asyncio.start_server(answer_wrongly, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = InterBrokerClient("broker-1", request_timeout_ms=30_000)
        try:
            with pytest.raises(BrokerNotAvailable, match="unknown correlation id 999"):
                await client.send(7, "127.0.0.1", port, ApiVersionsRequest(
                    client_software_name="ottla", client_software_version="1"))
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_the_late_answer_to_a_cancelled_request_is_dropped_not_fatal():
    """A sender that stops waiting (its task cancelled) leaves an answer on the way: it is
    dropped, and the requests behind it on the same connection still get theirs."""
    from kio.schema.api_versions.v3.response import ApiVersionsResponse

    from ottla.protocol.codec import encode_response, peek_header

    async def scenario():
        async def answer_in_pairs(reader, writer):
            while True:  # hold each answer until the next request came, then answer both
                held = []
                for _ in range(2):
                    size = int.from_bytes(await reader.readexactly(4), "big")
                    held.append(peek_header(await reader.readexactly(size))[2])
                for correlation_id in held:
                    writer.writelines(encode_response(18, 3, correlation_id, ApiVersionsResponse(
                        error_code=ErrorCode.none, api_keys=(), throttle_time=timedelta(0),
                        supported_features=(), finalized_features_epoch=-1, finalized_features=(),
                        zk_migration_ready=False)))
                await writer.drain()

        server = await asyncio.start_server(answer_in_pairs, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = InterBrokerClient("broker-1", request_timeout_ms=30_000)
        request = ApiVersionsRequest(client_software_name="ottla", client_software_version="1")
        try:
            abandoned = asyncio.create_task(client.send(8, "127.0.0.1", port, request))
            await asyncio.sleep(0.2)
            abandoned.cancel()
            answer = await client.send(8, "127.0.0.1", port, request)
            assert answer.error_code == ErrorCode.none
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_cancelled_send_ends_cancelled_even_as_its_answer_arrives():
    """Stopping a replica fetcher cancels its task mid-request: the cancellation must win
    even when the answer lands in the same instant (Python 3.11's `asyncio.wait_for` returned
    the answer instead, and a SIGTERMed broker's fetcher went on fetching for good)."""
    from kio.schema.api_versions.v3.response import ApiVersionsResponse

    from ottla.protocol.codec import encode_response, peek_header

    async def scenario():
        async def answer_at_once(reader, writer):
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                correlation_id = peek_header(await reader.readexactly(size))[2]
                writer.writelines(encode_response(18, 3, correlation_id, ApiVersionsResponse(
                    error_code=ErrorCode.none, api_keys=(), throttle_time=timedelta(0), supported_features=(),
                    finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False)))

        server = await asyncio.start_server(answer_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = InterBrokerClient("broker-1", request_timeout_ms=30_000)
        request = ApiVersionsRequest(client_software_name="ottla", client_software_version="1")
        outcomes = []
        try:
            await client.send(8, "127.0.0.1", port, request)  # connected
            for steps in range(40):  # cancel at every point from sending to answered
                task = asyncio.create_task(client.send(8, "127.0.0.1", port, request))
                for _ in range(steps):
                    await asyncio.sleep(0)
                if task.cancel():
                    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
                    outcomes.append(type(outcome).__name__)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()
        assert outcomes and set(outcomes) == {"CancelledError"}

    asyncio.run(scenario())


def test_markers_go_to_each_partitions_leader(tmp_path):
    """The transaction coordinator's marker channel: partitions led here are written
    in-process, partitions led by another broker (a real `ottla serve`, made the leader of
    `remote` by a metadata update as a controller would send) get WriteTxnMarkers over the
    network, and an unreachable leader answers a retriable error."""
    import uuid

    from ottla.config import BrokerConfig
    from ottla.server.broker import Broker
    from ottla.server.coordinator_runtime import BrokerMarkerChannel
    from ottla.server.metadata_cache import BrokerInfo, PartitionState

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    with broker() as b:
        produce(b.bootstrap, "remote", [b"x"])

        async def scenario():
            here = Broker(tmp_path, BrokerConfig({"node.id": 1}), port=0)
            await here.start()
            try:
                here.create_topic("local", 1, {})
                metadata = here.metadata
                metadata.update(controller_id=1, controller_epoch=1, topic_ids={"remote": uuid.uuid4(),
                                                                                  "gone": uuid.uuid4()},
                                brokers=[*metadata.brokers, BrokerInfo(2, b.host, b.port), BrokerInfo(3, "127.0.0.1", dead_port)],
                                partition_states=[PartitionState("remote", 0, 2, 0, (2,), (2,)),
                                                  PartitionState("gone", 0, 3, 0, (3,), (3,))])
                channel = BrokerMarkerChannel(here, here.interbroker)
                outcomes = await channel.write_txn_markers(4242, 0, 0, True, frozenset(
                    {("local", 0), ("remote", 0), ("gone", 0), ("nowhere", 0)}))
                assert outcomes == {("local", 0): ErrorCode.none, ("remote", 0): ErrorCode.none,
                                    ("gone", 0): ErrorCode.network_exception,
                                    ("nowhere", 0): ErrorCode.unknown_topic_or_partition}
                local_log = here.logs.get_log("local", 0)
                (header, _), = list(iter_batches(local_log.read(0, 1 << 20, max_offset=1).records))
                assert header.is_control and header.producer_id == 4242
                fetched = await here.interbroker.send(2, b.host, b.port, fetch_request("remote", 1))
                (header, _), = list(iter_batches(fetched.responses[0].partitions[0].records))
                assert header.is_control and header.producer_id == 4242 and header.base_offset == 1
            finally:
                await here.stop()

        asyncio.run(scenario())


def test_markers_go_at_the_highest_version_both_brokers_serve(tmp_path):
    """As Kafka's coordinator sends what ApiVersions negotiated: the leader (a real `ottla
    serve`, behind a proxy that notes each request's version) serves WriteTxnMarkers v0-2, so
    the markers go as v2, after one ApiVersions on the connection; a new connection asks again."""
    import uuid

    from ottla.config import BrokerConfig
    from ottla.server.broker import Broker
    from ottla.server.coordinator_runtime import BrokerMarkerChannel
    from ottla.server.metadata_cache import BrokerInfo, PartitionState
    from tests.faultproxy import FaultProxy

    with broker() as b, FaultProxy((b.host, b.port)) as proxy:
        produce(b.bootstrap, "remote", [b"x"])

        async def scenario():
            here = Broker(tmp_path, BrokerConfig({"node.id": 1}), port=0)
            await here.start()
            try:
                metadata = here.metadata
                metadata.update(controller_id=1, controller_epoch=1, topic_ids={"remote": uuid.uuid4()},
                                brokers=[*metadata.brokers, BrokerInfo(2, "127.0.0.1", proxy.port)],
                                partition_states=[PartitionState("remote", 0, 2, 0, (2,), (2,))])
                channel = BrokerMarkerChannel(here, here.interbroker)
                for commit in (True, False):
                    assert await channel.write_txn_markers(4242, 0, 0, commit, frozenset({("remote", 0)})) == {
                        ("remote", 0): ErrorCode.none}
                assert proxy.cut_all() == 1
                connection = here.interbroker.connection(2, "127.0.0.1", proxy.port)
                while connection.connected:  # until the coordinator's side has seen the cut
                    await asyncio.sleep(0.01)
                assert await channel.write_txn_markers(4243, 0, 0, True, frozenset({("remote", 0)})) == {
                    ("remote", 0): ErrorCode.none}
            finally:
                await here.stop()

        asyncio.run(scenario())
        markers = {version: n for (key, version), n in proxy.requests.items() if key == 27}
        api_versions = sum(n for (key, _), n in proxy.requests.items() if key == 18)
        assert (markers, api_versions) == ({2: 3}, 2)
        assert proxy.errors == []
