"""Tests of the test helper tests/faultproxy.py, against a tiny fake Kafka server (and, where
librdkafka is available, its in-process mock cluster). Nothing here involves Ottla."""

from __future__ import annotations

import datetime
import io
import socket
import socketserver
import struct
import sys
import threading
import time
from pathlib import Path

import kio.index
import kio.serial
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faultproxy import API_VERSIONS, FETCH, METADATA, PRODUCE, FaultProxy  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _encode(schema: type, entity: object) -> bytes:
    buffer = io.BytesIO()
    kio.serial.entity_writer(schema)(buffer, entity)
    return buffer.getvalue()


def _metadata_response(version: int, correlation_id: int, host: str, port: int) -> bytes:
    schema = kio.index.load_response_schema(METADATA, version)
    broker_type = schema.__dataclass_fields__["brokers"].type.__args__[0]
    brokers = (
        broker_type(node_id=1, host=host, port=port, rack=None),
        broker_type(node_id=2, host=host, port=port + 1, rack=None),
    )
    fields = {"brokers": brokers, "controller_id": 1, "topics": ()}
    if "throttle_time" in schema.__dataclass_fields__:
        fields["throttle_time"] = datetime.timedelta(0)
    if "cluster_id" in schema.__dataclass_fields__:
        fields["cluster_id"] = "fake"
    header = schema.__header_schema__(correlation_id=correlation_id)
    return _encode(schema.__header_schema__, header) + _encode(schema, schema(**fields))


class FakeKafka(socketserver.ThreadingTCPServer):
    """Answers every request with its correlation id and b"ok", and Metadata with a real
    (kio-encoded) response that advertises this server's own address. Records what it handled,
    so tests can tell a dropped response from a request that never arrived."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FakeKafkaHandler)
        self.handled: list[tuple[int, int]] = []
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05})

    @property
    def address(self) -> tuple[str, int]:
        return self.server_address[0], self.server_address[1]

    def __enter__(self) -> FakeKafka:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()


class _FakeKafkaHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock = self.request
        while True:
            frame = _recv_frame(sock)
            if frame is None:
                return
            api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
            self.server.handled.append((api_key, correlation_id))
            if api_key == METADATA:
                host, port = self.server.address
                body = _metadata_response(api_version, correlation_id, host, port)
            else:
                body = struct.pack(">i", correlation_id) + b"ok"
            sock.sendall(struct.pack(">i", len(body)) + body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _recv_frame(sock: socket.socket) -> bytes | None:
    try:
        prefix = _recv_exact(sock, 4)
        if prefix is None:
            return None
        return _recv_exact(sock, struct.unpack(">i", prefix)[0])
    except (ConnectionError, socket.timeout):
        return None


class Client:
    """A raw Kafka-framed client: v1 request headers, arbitrary bodies."""

    opened: list[Client] = []

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.next_id = 1
        Client.opened.append(self)

    def send(self, api_key: int, api_version: int = 0, body: bytes = b"") -> int:
        correlation_id = self.next_id
        self.next_id += 1
        client_id = b"test"
        frame = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return correlation_id

    def receive(self) -> bytes | None:
        """Next response frame, or None when the connection was closed."""
        return _recv_frame(self.sock)

    def close(self) -> None:
        self.sock.close()


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("faultproxy-")]


@pytest.fixture
def fake():
    with FakeKafka() as server:
        yield server


@pytest.fixture(autouse=True)
def _close_clients():
    """Close every raw client a test opened, so leaked sockets can only be the proxy's."""
    yield
    while Client.opened:
        Client.opened.pop().close()


def test_forwards_frames_both_ways(fake):
    with FaultProxy(fake.address) as proxy:
        client = Client(proxy.address)
        ids = [client.send(FETCH) for _ in range(3)]
        assert [struct.unpack(">i", client.receive()[:4])[0] for _ in ids] == ids
        client.close()
        assert proxy.stats["requests"] == 3 and proxy.stats["responses"] == 3
        assert proxy.errors == []


def test_drop_and_close_only_hits_the_given_api(fake):
    with FaultProxy(fake.address) as proxy:
        proxy.drop_responses(1.0, api_key=PRODUCE)
        client = Client(proxy.address)
        client.send(FETCH)
        assert client.receive()[4:] == b"ok"
        client.send(PRODUCE)
        assert client.receive() is None  # the connection was cut instead of answering
        assert (PRODUCE, 2) in fake.handled  # ... after the broker handled the request
        assert proxy.stats["dropped_responses"] == 1 and proxy.stats["cuts_after_drop"] == 1


def test_silent_drop_keeps_the_connection(fake):
    with FaultProxy(fake.address) as proxy:
        proxy.drop_responses(1.0, api_key=PRODUCE, close=False)
        client = Client(proxy.address)
        client.send(PRODUCE)
        later = client.send(API_VERSIONS)
        assert struct.unpack(">i", client.receive()[:4])[0] == later
        assert len(fake.handled) == 2 and proxy.open_connections == 1


def test_same_seed_same_faults(fake):
    def run(seed: int) -> list[int]:
        with FaultProxy(fake.address, seed=seed) as proxy:
            proxy.drop_responses(0.5, close=False)
            client = Client(proxy.address)
            ids = [client.send(FETCH) for _ in range(40)]
            deadline = time.monotonic() + 5
            while proxy.stats["responses"] + proxy.stats["dropped_responses"] < len(ids):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            client.sock.settimeout(0.2)
            received = []
            while (frame := client.receive()) is not None:
                received.append(struct.unpack(">i", frame[:4])[0])
            return received

    first, again, other = run(1), run(1), run(2)
    assert first == again
    assert 5 < len(first) < 35
    assert first != other


def test_delay(fake):
    with FaultProxy(fake.address) as proxy:
        proxy.delay_responses(0.3, api_key=FETCH)
        client = Client(proxy.address)
        client.send(API_VERSIONS)
        client.receive()
        assert proxy.stats["delayed_responses"] == 0
        started = time.monotonic()
        client.send(FETCH)
        client.receive()
        assert time.monotonic() - started >= 0.3
        assert proxy.stats["delayed_responses"] == 1


def test_cut_on_demand_and_at_random(fake):
    with FaultProxy(fake.address) as proxy:
        client = Client(proxy.address)
        client.send(FETCH)
        client.receive()
        assert proxy.cut_all() == 1
        assert client.receive() is None
        assert proxy.stats["cuts_on_demand"] == 1

        proxy.cut_randomly(1.0)
        client = Client(proxy.address)
        client.send(FETCH)
        assert client.receive() is None
        assert proxy.stats["random_cuts"] == 1
        assert len(fake.handled) == 1  # the cut request never reached the broker

        proxy.clear_faults()
        client = Client(proxy.address)
        client.send(FETCH)
        assert client.receive()[4:] == b"ok"


@pytest.mark.parametrize("version", [1, 9, 12])
def test_rewrites_advertised_addresses(fake, version):
    request_schema = kio.index.load_request_schema(METADATA, version)
    fields = {"topics": None} if version >= 1 else {"topics": ()}
    for name in ("allow_auto_topic_creation", "include_cluster_authorized_operations",
                 "include_topic_authorized_operations"):
        if name in request_schema.__dataclass_fields__:
            fields[name] = False
    body = _encode(request_schema, request_schema(**fields))
    if request_schema.__flexible__:
        body = b"\x00" + body  # empty tagged-field section of request header v2

    response_schema = kio.index.load_response_schema(METADATA, version)
    with FaultProxy(fake.address, rewrite_addresses=True) as proxy:
        client = Client(proxy.address)
        client.send(METADATA, version, body)
        frame = client.receive()
        header, offset = kio.serial.entity_reader(response_schema.__header_schema__)(frame, 0)
        response, size = kio.serial.entity_reader(response_schema)(frame, offset)
        assert offset + size == len(frame) and header.correlation_id == 1
        assert {(b.host, b.port) for b in response.brokers} == {("127.0.0.1", proxy.port)}
        assert [b.node_id for b in response.brokers] == [1, 2]
        assert proxy.stats["rewritten_responses"] == 1 and proxy.errors == []


def test_upstream_can_be_set_after_start(fake):
    """The --advertised flow: take the proxy's port first, start the broker, then connect."""
    with FaultProxy() as proxy:
        client = Client(proxy.address)
        client.send(FETCH)
        assert client.receive() is None
        proxy.upstream = fake.address
        client = Client(proxy.address)
        client.send(FETCH)
        assert client.receive()[4:] == b"ok"


def test_stop_leaves_no_threads_or_connections(fake):
    before = len(_proxy_threads())
    proxy = FaultProxy(fake.address).start()
    clients = [Client(proxy.address) for _ in range(3)]
    for client in clients:
        client.send(FETCH)
        client.receive()
    assert len(_proxy_threads()) == before + 1
    proxy.stop()
    assert len(_proxy_threads()) == before
    for client in clients:
        assert client.receive() is None
    with pytest.raises(OSError):
        Client(f"127.0.0.1:{proxy.port}", timeout=1)
    proxy.stop()  # idempotent

    with proxy:  # starts again, on the same port
        client = Client(f"127.0.0.1:{proxy.port}")
        client.send(FETCH)
        assert client.receive()[4:] == b"ok"
    assert len(_proxy_threads()) == before


def test_producer_retries_through_mock_cluster():
    """librdkafka's mock cluster as upstream: with 30% of Produce responses dropped and the
    connection cut, the producer retries through the proxy until every message is stored.
    (The mock checks sequence numbers only for transactional producers, so the retried
    batches it had already appended show up twice; Ottla must not do that.)"""
    import confluent_kafka
    mock_owner = confluent_kafka.Producer({"test.mock.num.brokers": 1, "log_level": 0})
    brokers = mock_owner.list_topics(timeout=10).brokers
    mock = next(iter(brokers.values()))

    with FaultProxy((mock.host, mock.port), seed=3, rewrite_addresses=True) as proxy:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": proxy.address, "enable.idempotence": True, "linger.ms": 5, "log_level": 0}
        )
        metadata = producer.list_topics(timeout=10)
        assert {(b.host, b.port) for b in metadata.brokers.values()} == {("127.0.0.1", proxy.port)}

        proxy.drop_responses(0.3, api_key=PRODUCE)
        failures = []
        for i in range(300):
            producer.produce("t", value=str(i).encode(), partition=0,
                             on_delivery=lambda err, msg: err and failures.append(err))
            if i % 30 == 29:
                producer.flush(30)
        assert producer.flush(30) == 0 and failures == []
        assert proxy.stats["dropped_responses"] > 0
        proxy.clear_faults()

        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": proxy.address, "group.id": "g", "enable.partition.eof": True,
             "auto.offset.reset": "earliest", "log_level": 0}
        )
        consumer.assign([confluent_kafka.TopicPartition("t", 0, confluent_kafka.OFFSET_BEGINNING)])
        values = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(msg.error())
            values.append(int(msg.value()))
        consumer.close()
        assert set(values) == set(range(300))
        assert proxy.errors == []
