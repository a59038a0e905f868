"""Hand-rolled Kafka requests for tests that must send what no well-behaved client would."""

from __future__ import annotations

import fcntl
import io
import socket
import struct
import termios

from ottla.protocol.schemas import response_schema
from kio.serial import entity_reader, entity_writer


def encode_request(request, correlation_id: int = 1, client_id: str = "ottla-tests") -> bytes:
    header_type = type(request).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(request_api_key=request.__api_key__,
                                                request_api_version=request.__version__,
                                                correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(request))(out, request)
    payload = out.getvalue()
    return struct.pack(">i", len(payload)) + payload


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame; raises ConnectionError when the broker closed the connection."""
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        data += chunk
    return bytes(data)


def decode_response(frame: bytes, api_key: int, api_version: int):
    """Returns (correlation_id, response entity)."""
    schema = response_schema(api_key, api_version)
    header, header_size = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, header_size)
    return header.correlation_id, body


def roundtrip(sock: socket.socket, request, correlation_id: int = 1):
    sock.sendall(encode_request(request, correlation_id))
    return decode_response(read_frame(sock), request.__api_key__, request.__version__)


def is_closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the broker closes the connection (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def unread_bytes(sock: socket.socket) -> int:
    """Bytes waiting in `sock` that the test has not read (a consumer that never reads)."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0]


def stuck_consumers(host: str, port: int, requests: bytes, count: int) -> list[socket.socket]:
    """`count` connections with a 4 KiB receive buffer that each send `requests` and never read."""
    stuck = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, port))
        sock.sendall(requests)
        stuck.append(sock)
    return stuck


def process_memory(pid: int, field: str) -> int:
    """A process's VmRSS or VmHWM, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")
