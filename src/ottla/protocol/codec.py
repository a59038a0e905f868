"""Kafka wire framing and request/response codecs, with no I/O inside (h11 style).

`FrameDecoder` turns a byte stream into size-prefixed frames; `decode_request` turns a
frame into a kio request entity; `encode_response` does the reverse. Everything that can
go wrong raises a `ProtocolViolation` subclass telling the network layer what Kafka does:
answer (ApiVersions with UNSUPPORTED_VERSION) or close the connection. The client side, for
broker-to-broker requests, is `encode_request` and `decode_response`.
"""

from __future__ import annotations

import io
import struct
import sys
import threading
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity
from kio.serial import entity_reader, entity_writer
# kio's own per-field writers, so that a response with `Encoded` items is written exactly as
# kio writes it (tests/unit/test_metadata_encoded.py compares the bytes for every version).
from kio.serial._introspect import get_field_tag
from kio.serial._serialize import get_field_writer
from kio.serial.writers import write_compact_array_length, write_legacy_array_length, write_unsigned_varint

from .errors import FrameTooLarge, MalformedRequest, ProtocolViolation, UnknownApi, UnsupportedApiVersion
from .schemas import api_name, request_schema, response_schema
from .shape import UnknownTaggedFields, check_request, strip_unknown_tagged_fields

__all__ = ["FrameTooLarge", "MalformedRequest", "ProtocolViolation", "UnknownApi", "UnsupportedApiVersion",
           "FrameDecoder", "DecodedRequest", "decode_request", "encode_response", "Encoded", "EncodedBody",
           "encode_item",
           "peek_header",
           "response_schema"]

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id

API_VERSIONS_KEY = 18

_scratch_buffers = threading.local()


def _scratch(size: int) -> memoryview:
    """This thread's scratch buffer of `size` bytes, shared by its FrameDecoders."""
    views = _scratch_buffers.__dict__
    view = views.get(size)
    if view is None:
        view = views[size] = memoryview(bytearray(size))
    return view


class FrameDecoder:
    """Splits a TCP byte stream into Kafka frames (4-byte big-endian size, then payload).

    Made for asyncio's BufferedProtocol: the socket reads straight into `get_buffer()`.
    Reads land in a scratch buffer shared by the thread's decoders, and whole frames are cut
    out of it; only the bytes of a frame still incomplete at the end of a read move into a
    staging buffer of the connection's own, which goes again once it is empty. So a connection
    holds nothing between requests, and its end (the read that finds EOF) allocates nothing:
    5,200 connections closing at once took 1.4 GB when each had a staging buffer made for that
    read (docs/performance.md). A frame too big for staging gets a buffer of its own, so a
    1 MB produce request is received with no intermediate copies. That buffer starts at most
    `_FIRST_FRAME_BUFFER` and doubles as bytes arrive: a peer declaring 100 MB and sending
    12 bytes holds 2 MiB, not 100 MB.

    `reserve(size)`, when given, is asked before each frame is read (Kafka's memory pool for
    `queued.max.request.bytes`); when it says no, the decoder stops at that frame and sets
    `blocked` until `buffer_updated(0)` is called again. Every frame handed out carries a
    reservation of its size, which the caller releases once the request is done.
    """

    __slots__ = ("_staging", "_view", "_start", "_end", "_frame", "_frame_size", "_filled", "_max_frame",
                 "_staging_bytes", "_reserve", "_head_reserved", "blocked")

    def __init__(self, max_frame_bytes: int, staging_bytes: int = 256 * 1024, reserve=None):
        self._staging_bytes = staging_bytes
        self._staging: bytearray | None = None
        self._view: memoryview | None = None  # None: the next read goes to the shared scratch buffer
        self._start = 0
        self._end = 0
        self._frame: memoryview | None = None
        self._frame_size = 0
        self._filled = 0
        self._max_frame = max_frame_bytes
        self._reserve = reserve
        self._head_reserved = False  # the frame whose size was read holds its reservation
        self.blocked = False

    def get_buffer(self) -> memoryview:
        if self._frame is not None:
            if self._filled == len(self._frame):  # grow as bytes arrive, never past the declared size
                grown = _frame_buffer(min(self._frame_size, 2 * len(self._frame)))
                grown[: self._filled] = self._frame[: self._filled]
                self._frame = grown
            return self._frame[self._filled :]
        if self._view is None:
            return _scratch(self._staging_bytes)
        return self._view[self._end :]

    def buffer_updated(self, count: int) -> list[bytes | memoryview]:
        """Take the `count` bytes just read into `get_buffer()` (the same thread, no other
        decoder's read in between: the scratch buffer is shared)."""
        if self._frame is not None:
            self._filled += count
            if self._filled < self._frame_size:
                return _NO_FRAMES
            frame, self._frame = self._frame, None
            self._head_reserved = False
            return [frame.toreadonly()]  # kio parses read-only buffers only
        if self._view is None:
            view, start, end = _scratch(self._staging_bytes), 0, count
        else:
            self._end += count
            view, start, end = self._view, self._start, self._end
        self.blocked = False
        frames: list[bytes | memoryview] = []
        while end - start >= 4:
            (size,) = _SIZE.unpack_from(view, start)
            if size < 0:
                raise MalformedRequest(f"negative frame size {size}")
            if size > self._max_frame:
                raise FrameTooLarge(f"frame of {size} bytes exceeds socket.request.max.bytes ({self._max_frame})")
            if not self._head_reserved:
                if self._reserve is not None and not self._reserve(size):
                    self.blocked = True
                    break
                self._head_reserved = True
            if end - start - 4 >= size:
                frames.append(bytes(view[start + 4 : start + 4 + size]))
                self._head_reserved = False
                start += 4 + size
                continue
            if 4 + size > self._staging_bytes // 2:
                # Too big to stage: move what arrived into a buffer of its own.
                self._filled = end - start - 4
                self._frame_size = size
                self._frame = _frame_buffer(min(size, max(_FIRST_FRAME_BUFFER, self._filled)))
                self._frame[: self._filled] = view[start + 4 : end]
                start = end
            break
        if start == end:
            self._staging = self._view = None
            start = end = 0
        elif self._view is None:
            # An incomplete frame (or one waiting for memory) in the scratch buffer: it needs a
            # staging buffer of its own until it is complete.
            self._staging = bytearray(self._staging_bytes)
            self._view = memoryview(self._staging)
            self._view[: end - start] = view[start:end]
            start, end = 0, end - start
        elif start and len(self._staging) - end < len(self._staging) // 4:
            # Running out of room: move the partial frame to the front of the staging buffer.
            view[: end - start] = view[start:end]
            start, end = 0, end - start
        self._start, self._end = start, end
        return frames

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """Push bytes through the buffered path (for callers that already hold the data)."""
        frames = []
        offset = 0
        while offset < len(data):
            target = self.get_buffer()
            count = min(len(target), len(data) - offset)
            target[:count] = data[offset : offset + count]
            offset += count
            frames += self.buffer_updated(count)
        return frames

    @property
    def buffered(self) -> int:
        return (self._end - self._start) + (self._filled if self._frame is not None else 0)

    @property
    def reserved(self) -> int:
        """The reservation held by the frame being received (to release if the peer goes away)."""
        if not self._head_reserved:
            return 0
        if self._frame is not None:
            return self._frame_size
        return _SIZE.unpack_from(self._view, self._start)[0]


# A large frame's own buffer starts here and doubles as bytes arrive (a 1 MB produce request
# still arrives in one buffer with no copy).
_FIRST_FRAME_BUFFER = 2 * 1024 * 1024
_NO_FRAMES: list = []  # never appended to: what a read that completes no frame returns


def _frame_buffer(size: int) -> memoryview:
    """A writable buffer of `size` bytes for one large frame, not zeroed when numpy is loaded:
    the socket fills every byte before the frame is handed out, and zeroing a 1 MB produce
    request cost 1.5% of the broker's CPU per MB (memset). numpy is not imported for this:
    the record validator loads it with the first large batch, and importing it here would
    hold the loop for a junk frame too."""
    np = sys.modules.get("numpy")
    return memoryview(bytearray(size) if np is None else np.empty(size, dtype=np.uint8))


@dataclass(slots=True)
class DecodedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    header: Any
    body: Any


@cache
def _request_codec(api_key: int, api_version: int):
    schema = request_schema(api_key, api_version)
    return schema, entity_reader(schema.__header_schema__), entity_reader(schema)


@cache
def _response_writers(api_key: int, api_version: int):
    schema = response_schema(api_key, api_version)
    return schema.__header_schema__, entity_writer(schema.__header_schema__), entity_writer(schema)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    if len(frame) < _HEADER_PREFIX.size:
        raise MalformedRequest(f"request of {len(frame)} bytes is shorter than a request header")
    return _HEADER_PREFIX.unpack_from(frame, 0)


def decode_request(frame: bytes, supported: dict[int, tuple[int, int]]) -> DecodedRequest:
    """Parse one frame against the versions we serve (`supported`: api key -> (min, max))."""
    api_key, api_version, correlation_id = peek_header(frame)
    versions = supported.get(api_key)
    if versions is None:
        raise UnknownApi(f"unknown API key {api_key}")
    if not versions[0] <= api_version <= versions[1]:
        raise UnsupportedApiVersion(api_key, api_version, correlation_id)
    try:
        _, read_header, read_body = _request_codec(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        raise UnsupportedApiVersion(api_key, api_version, correlation_id) from None
    try:
        try:
            check_request(frame, api_key, api_version)  # kio trusts counts: see protocol/shape.py
        except UnknownTaggedFields:
            frame = strip_unknown_tagged_fields(frame, api_key, api_version)
        header, header_size = read_header(frame, 0)
        body, _ = read_body(frame, header_size)
    except Exception as exc:  # kio raises several types on garbage; all mean the same here
        raise MalformedRequest(f"cannot parse {api_name(api_key)} v{api_version}: {exc}") from None
    # Bytes after the body are ignored, as Kafka's broker does: librdkafka's all-topics
    # Metadata v12 request carries a few.
    return DecodedRequest(api_key, api_version, correlation_id, header, body)


class _FrameChunks:
    """A kio `Writable` that keeps large values (fetched record batches) by reference.

    Small fields accumulate in a bytearray; a value of `_BY_REFERENCE_BYTES` or more becomes
    a chunk of its own, so a fetch response is never copied into one buffer before the
    socket copies it once more. Such a value may be any object with a length that the
    connection knows how to send (log/file_records.FileRecords: records still in their file).
    """

    __slots__ = ("chunks", "_small")

    def __init__(self):
        self._small = bytearray(_SIZE.size)  # the size prefix, filled in by `frame`
        self.chunks: list[bytes | bytearray | memoryview] = [self._small]

    def write(self, data) -> int:
        size = len(data)  # once: kio writes a response a field at a time (~100 calls a Produce answer)
        if size >= _BY_REFERENCE_BYTES:
            self.chunks.append(data)
            self._small = bytearray()
            self.chunks.append(self._small)
        else:
            self._small += data
        return size

    def frame(self) -> list[bytes | bytearray | memoryview]:
        chunks = [chunk for chunk in self.chunks if len(chunk)]
        _SIZE.pack_into(chunks[0], 0, sum(len(chunk) for chunk in chunks) - _SIZE.size)
        return chunks


_BY_REFERENCE_BYTES = 16 * 1024


class Encoded(tuple):
    """The items of a response's top-level array, each already encoded (bytes): how a handler
    reuses the parts of an answer that did not change (Metadata's topics), instead of
    building and encoding them again for every request."""

    __slots__ = ()


class EncodedBody(bytes):
    """A whole response body already encoded: a handler's answer that is the same bytes every
    time (Fetch's answers with nothing in them, `handlers/fetch.py`); only the header is written."""

    __slots__ = ()


def encode_item(item: Any) -> bytes:
    """One array item (a kio entity) as `Encoded` expects it."""
    out = io.BytesIO()
    entity_writer(type(item))(out, item)
    return out.getvalue()


@cache
def _names(entity_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(entity_type))


@cache
def _field_writers(entity_type: type) -> tuple:
    """(name, writer, array length writer) per field of a response without tagged fields."""
    if any(get_field_tag(f) is not None for f in fields(entity_type)):
        raise TypeError(f"{entity_type.__name__} has tagged fields: Encoded items are not supported")
    length = write_compact_array_length if entity_type.__flexible__ else write_legacy_array_length
    return tuple((f.name, get_field_writer(f, entity_type.__flexible__, False, False), length)
                 for f in fields(entity_type))


def _write_with_encoded(out, response: Any) -> None:
    """kio's entity writer, except that `Encoded` arrays are written as they are."""
    for name, writer, write_length in _field_writers(type(response)):
        value = getattr(response, name)
        if isinstance(value, Encoded):
            write_length(out, len(value))
            for item in value:
                out.write(item)
        else:
            writer(out, value)
    if type(response).__flexible__:
        write_unsigned_varint(out, 0)  # no tagged fields


def encode_response(api_key: int, api_version: int, correlation_id: int, response: Any
                    ) -> list[bytes | bytearray | memoryview]:
    """A size-prefixed response frame, as chunks to write in order (their concatenation is
    the frame); the header version follows the response schema."""
    header_schema, write_header, write_body = _response_writers(api_key, api_version)
    out = _FrameChunks()
    write_header(out, header_schema(correlation_id=correlation_id))
    if type(response) is EncodedBody:
        out.write(response)
    elif any(isinstance(getattr(response, name), Encoded) for name in _names(type(response))):
        _write_with_encoded(out, response)
    else:
        write_body(out, response)
    return out.frame()


# -- the client side (inter-broker requests) ---------------------------------------------


@cache
def _request_writers(request_type: type):
    header_schema = request_type.__header_schema__
    return header_schema, entity_writer(header_schema), entity_writer(request_type)


def encode_request(request: Any, correlation_id: int, client_id: str | None) -> bytes:
    """A size-prefixed request frame for a kio request entity (its type names API and version)."""
    header_schema, write_header, write_body = _request_writers(type(request))
    out = io.BytesIO()
    out.write(bytes(_SIZE.size))
    write_header(out, header_schema(request_api_key=request.__api_key__, request_api_version=request.__version__,
                                    correlation_id=correlation_id, client_id=client_id))
    write_body(out, request)
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    del frame
    return out.getvalue()


def response_correlation_id(frame: bytes | memoryview) -> int:
    """Every response header starts with the correlation id: enough to find its request."""
    if len(frame) < 4:
        raise ProtocolViolation(f"response of {len(frame)} bytes is shorter than a response header")
    return _SIZE.unpack_from(frame, 0)[0]


@cache
def _response_readers(api_key: int, api_version: int):
    schema = response_schema(api_key, api_version)
    return entity_reader(schema.__header_schema__), entity_reader(schema)


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, kio response entity) of one response frame (without its size prefix)."""
    read_header, read_body = _response_readers(api_key, api_version)
    try:
        header, header_size = read_header(frame, 0)
        body, _ = read_body(frame, header_size)
    except Exception as exc:  # kio raises several types on garbage
        raise ProtocolViolation(f"cannot parse response of API {api_key} v{api_version}: {exc}") from None
    return header.correlation_id, body
