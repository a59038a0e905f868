"""What connections may hold (issue 11, F7): buffers grow as bytes arrive, Kafka's
`queued.max.request.bytes`, `connections.max.idle.ms`, `max.connections` and
`max.connections.per.ip`."""

import socket
import struct
import time

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from tests.wire import decode_response, encode_request, is_closed, read_frame, roundtrip

API_VERSIONS = ApiVersionsRequest(client_software_name="t", client_software_version="1")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _answers(sock: socket.socket) -> bool:
    _, response = roundtrip(sock, API_VERSIONS)
    return response.error_code == ErrorCode.none


def test_half_sent_frames_hold_only_what_arrived(ottla_broker, raw_connection):
    # Ten connections each declare a 100 MB frame and send 12 bytes of it (issue 11, F7).
    assert _answers(raw_connection(ottla_broker.bootstrap))
    before = _rss_bytes(ottla_broker.pid)
    liars = [raw_connection(ottla_broker.bootstrap) for _ in range(10)]
    for sock in liars:
        sock.sendall(struct.pack(">i", 100_000_000) + bytes(12))
    # A request on another connection is answered after the liars' bytes were read.
    assert _answers(raw_connection(ottla_broker.bootstrap))
    grown = _rss_bytes(ottla_broker.pid) - before
    assert grown < 100 << 20, f"RSS grew by {grown >> 20} MiB"
    assert ottla_broker.running()


def test_queued_request_bytes_pause_reading_until_memory_is_given_back(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"queued.max.request.bytes": 1 << 20})
    holder = raw_connection(broker.bootstrap)
    holder.sendall(struct.pack(">i", 5 << 20) + bytes(1000))  # admitted: the pool was empty
    waiting = raw_connection(broker.bootstrap)
    time.sleep(0.5)  # let the broker read the holder's bytes first
    waiting.sendall(encode_request(API_VERSIONS, correlation_id=9))
    waiting.settimeout(2)
    try:
        waiting.recv(1)
        answered_while_full = True
    except socket.timeout:
        answered_while_full = False
    assert not answered_while_full
    holder.close()  # its reservation goes back to the pool
    waiting.settimeout(30)
    correlation_id, response = decode_response(read_frame(waiting), 18, 3)
    assert (correlation_id, response.error_code) == (9, ErrorCode.none)


def test_idle_connections_are_closed(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"connections.max.idle.ms": 300})
    idle = raw_connection(broker.bootstrap)
    assert _answers(idle)
    assert is_closed(idle, timeout=30)
    assert _answers(raw_connection(broker.bootstrap))


def test_connections_over_the_per_ip_and_broker_limits_are_closed(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"max.connections.per.ip": 2})
    first, second = raw_connection(broker.bootstrap), raw_connection(broker.bootstrap)
    assert _answers(first) and _answers(second)
    assert is_closed(raw_connection(broker.bootstrap))
    second.close()
    _wait_until(lambda: _try_answer(broker.bootstrap))

    broker = ottla_broker_factory({"max.connections": 1}, name="limited")
    only = raw_connection(broker.bootstrap)
    assert _answers(only)
    assert is_closed(raw_connection(broker.bootstrap))
    only.close()
    _wait_until(lambda: _try_answer(broker.bootstrap))


def _try_answer(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            return _answers(sock)
        except ConnectionError:
            return False


def _wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.1)


def test_a_consumer_that_never_reads_its_response_is_closed_when_idle(ottla_broker_factory):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

    broker = ottla_broker_factory({"connections.max.idle.ms": 1000})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("big", 1, 1)])["big"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for _ in range(800):
        producer.produce("big", b"v" * 10_000)
    producer.flush(60)
    host, _, port = broker.bootstrap.rpartition(":")
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect((host, int(port)))
    from datetime import timedelta
    stuck.sendall(encode_request(FetchRequest(max_wait=timedelta(0), min_bytes=1, max_bytes=2**31 - 1, topics=(
        FetchTopic(topic="big", partitions=(FetchPartition(partition=0, fetch_offset=0,
                                                           partition_max_bytes=2**31 - 1),)),),
        forgotten_topics_data=())))
    time.sleep(8)  # many idle periods without reading a byte of the 8 MB response
    stuck.settimeout(30)
    received = 0
    try:
        while chunk := stuck.recv(1 << 16):
            received += len(chunk)
    except ConnectionResetError:
        pass
    except socket.timeout:
        pass  # still open: the whole response arrived and nothing more
    # The broker gave up on it: what was already in the socket buffers, then end of stream.
    assert received < 8_000_000
    stuck.close()
