"""Shared test helpers. The `ottla_broker` fixtures come from the installed ottla pytest plugin."""

import socket
import struct
import threading
import time

import pytest
from kazoo.client import KazooClient

from ottla.testing.broker import STARTED

BROKER_LOG_LINES = 60
# How long a kafka-python thread may take to end once its client is closed (close joins it; a
# producer closed with a short timeout is force-closed and its sender ends just after).
CLIENT_THREAD_EXIT_S = 10.0


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


def _kafka_python_threads() -> set[threading.Thread]:
    """Live threads of kafka-python clients: a consumer's or admin client's I/O thread (its
    selector's `run_forever`), a producer's sender, a metrics expiry loop. Every client has one
    while it is open (with the sockets its selector holds) and none once closed."""
    def of_kafka(thread: threading.Thread) -> bool:
        target = getattr(thread, "_target", None)
        return type(thread).__module__.startswith("kafka.") or getattr(target, "__module__", "").startswith("kafka.")
    return {thread for thread in threading.enumerate() if of_kafka(thread)}


@pytest.fixture(autouse=True)
def no_kafka_python_client_left_open():
    """A test that leaves a kafka-python client open fails: its thread keeps polling (a stopped
    broker's metadata, for the rest of the session) and calls `random`, which shifts later tests'
    Hypothesis draws. Clients of fixtures with a wider scope started before this check did, so
    their threads are not counted; function-scoped fixtures are torn down before it runs."""
    before = _kafka_python_threads()
    yield
    left = _kafka_python_threads() - before
    deadline = time.monotonic() + CLIENT_THREAD_EXIT_S
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sorted(thread.name for thread in left if thread.is_alive())
    if left:
        pytest.fail(f"kafka-python client(s) left open (close them): threads {', '.join(left)}", pytrace=False)
