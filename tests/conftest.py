"""Shared test helpers. The `ottla_broker` fixtures come from the installed ottla pytest plugin."""

import socket
import struct

import pytest
from kazoo.client import KazooClient

from ottla.testing.broker import STARTED

BROKER_LOG_LINES = 60


def kafka_frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.fixture
def raw_connection():
    """Open raw TCP connections to a broker address; closed after the test."""
    opened = []

    def connect(bootstrap: str, timeout: float = 10.0) -> socket.socket:
        host, _, port = bootstrap.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        opened.append(sock)
        return sock

    yield connect
    for sock in opened:
        sock.close()


@pytest.fixture
def zk_client():
    """Call with a ZooKeeper connect string for a started kazoo client, to look at the znodes the
    brokers write; every client is closed after the test (before module-scoped servers stop)."""
    started = []

    def connect(hosts: str) -> KazooClient:
        client = KazooClient(hosts=hosts)
        client.start(timeout=30)
        started.append(client)
        return client

    yield connect
    for client in started:
        client.stop()
        client.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the last lines each broker it could see wrote (warnings
    by default): a cluster failure on CI is otherwise a timeout with no cause."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for handle in sorted(STARTED, key=lambda h: str(h.stderr_path)):
        lines = handle.read_stderr().splitlines()[-BROKER_LOG_LINES:]
        if lines:
            report.sections.append((f"broker log {handle.stderr_path}", "\n".join(lines)))
