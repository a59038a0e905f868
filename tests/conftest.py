"""Shared test helpers. The `ottla_broker` fixtures come from the installed ottla pytest plugin."""

import socket
import struct

import pytest


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
