"""The asyncio network layer: connections, framing, ordered responses.

Like Kafka's SocketServer, each connection handles one request at a time (pipelined
requests queue up and their responses go out in order) while different connections
proceed concurrently. Protocol violations close only the offending connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from ..errors import KafkaError
from ..log.file_records import FileRecords, RecordsGone
from ..protocol.codec import (
    API_VERSIONS_KEY,
    EncodedBody,
    FrameDecoder,
    ProtocolViolation,
    UnsupportedApiVersion,
    decode_request,
    encode_response,
)
from ..protocol.schemas import api_name
from ..protocol.shape import produce_entries
from ..records.legacy import LazyDownConversion
from .context import CloseConnection, RequestContext
from .handlers import controlled_shutdown, leader_and_isr, stop_replica, update_metadata
from .loop_lag import timed

if TYPE_CHECKING:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse
    from .broker import Broker

log = logging.getLogger("ottla.network")

_MAX_QUEUED_REQUESTS = 64
# Responses go to the transport in slices of this size (see Connection._send).
_WRITE_SLICE_BYTES = 256 * 1024
_connection_ids = itertools.count(1)
# Frames from this size on are decoded in a worker thread (see Connection._handle): a 54 KB
# ListOffsets naming 2,000 topics took 50 ms to decode on the loop.
_DECODE_ON_LOOP_BYTES = 16 * 1024
_PRODUCE_KEY = b"\x00\x00"
# A Produce naming more topic and partition entries than this is decoded in a worker thread.
_PRODUCE_ENTRIES_ON_LOOP = 64
# Responses with a top-level array longer than this are encoded in a worker thread: encoding
# costs about 0.2 ms per topic of a CreateTopics answer (its config entries included), so 500
# topics held the loop for 90 ms in one step.
_ENCODE_ON_LOOP_ITEMS = 64
_field_names: dict[type, tuple[str, ...]] = {}
# What a cluster broker answers before the controller's first UpdateMetadata: ApiVersions and
# the controller's own requests.
_BEFORE_THE_CLUSTER = frozenset({API_VERSIONS_KEY, leader_and_isr.API_KEY, stop_replica.API_KEY,
                                 update_metadata.API_KEY, controlled_shutdown.API_KEY})


def _arrays(entity) -> list[tuple]:
    names = _field_names.get(type(entity))
    if names is None:
        names = _field_names[type(entity)] = tuple(f.name for f in dataclasses.fields(entity))
    return [value for value in (getattr(entity, name) for name in names) if isinstance(value, tuple)]


def _many_items(response) -> bool:
    """A top-level array, or one inside its items (OffsetFetch v8+ answers every topic inside
    its one group: 2,000 topics took 18 ms to encode), longer than `_ENCODE_ON_LOOP_ITEMS`."""
    for array in _arrays(response):
        if len(array) > _ENCODE_ON_LOOP_ITEMS:
            return True
        for item in array:
            if dataclasses.is_dataclass(item) and any(len(inner) > _ENCODE_ON_LOOP_ITEMS for inner in _arrays(item)):
                return True
    return False


def _drop_transport_cycle(transport: asyncio.Transport | None) -> None:
    """Python 3.11's socket transport keeps a bound method of itself (`_read_ready_cb`), so each
    closed one, with its socket and its dict, was cyclic garbage that only a full collection
    frees: after 5,000 connections closed, one such collection held the loop for 255-448 ms
    (docs/performance.md). CPython 3.12 drops it on close (gh-100348); this does the same once
    the transport has closed and calls us for the last time. A no-op where it is already gone."""
    if getattr(transport, "_read_ready_cb", None) is not None:
        transport._read_ready_cb = None


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: "Broker"):
        self.broker = broker
        self.memory = broker.connections.memory
        self.decoder = FrameDecoder(broker.config["socket.request.max.bytes"], reserve=self.memory.try_reserve)
        self.pending: deque[bytes | memoryview] = deque()
        self.writable = asyncio.Event()
        self.writable.set()
        self.transport: asyncio.Transport | None = None
        # Handles `pending` in order while there is any: an idle connection has no task, so the
        # garbage collector walks a dozen fewer objects for each (a full collection walks every
        # connection's objects; 5,000 idle ones made it 100-450 ms, docs/performance.md).
        self.worker: asyncio.Task | None = None
        self.reading_paused = False
        self.closed = False
        self.id = f"c{next(_connection_ids)}"
        self.peer = "?"
        self.peer_host = ""
        self.handling = False  # a handler is working on a request (it may wait, e.g. a long poll)
        self.what = ""  # "ApiName vN" of the request being handled, for the loop-hold attribution
        self.last_active = time.monotonic()

    # asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer_host = peer[0] if peer else ""
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        refused = self.broker.connections.add(self)
        if refused is not None:
            log.info("rejected connection %s from %s: %s", self.id, self.peer, refused)
            self.closed = True
            transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int):
        self.last_active = time.monotonic()
        self._take_frames(nbytes)

    def memory_available(self):
        """queued.max.request.bytes has room again: admit the frame we stopped at."""
        if not self.closed:
            self._take_frames(0)

    def _take_frames(self, nbytes: int):
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except ProtocolViolation as exc:
            self.close(f"protocol violation: {exc}")
            return
        if frames:
            self.pending.extend(frames)
            if self.worker is None:
                self.worker = asyncio.get_running_loop().create_task(self._serve())
        elif not (self.decoder.blocked or self.reading_paused):
            return  # most reads of a large request: nothing that pausing depends on changed
        if self.decoder.blocked:
            self.memory.wait(self)
        self._update_reading()

    def _update_reading(self):
        """Read while fewer than _MAX_QUEUED_REQUESTS wait and the memory pool admits our next frame."""
        limit = _MAX_QUEUED_REQUESTS // 2 if self.reading_paused else _MAX_QUEUED_REQUESTS
        pause = self.decoder.blocked or len(self.pending) >= limit
        if pause != self.reading_paused and not self.closed:
            self.reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def idle_since(self, deadline: float) -> bool:
        """No handler at work and no bytes moved since `deadline`: a response the peer does not
        read counts as idle, as in Kafka, so a stuck consumer does not pin it forever."""
        return not self.handling and self.last_active < deadline

    def connection_lost(self, exc):
        self.closed = True
        self.broker.connections.discard(self)
        # Give back the memory reserved for what will now never be handled.
        self.memory.release(sum(len(frame) for frame in self.pending) + self.decoder.reserved)
        self.pending.clear()
        self.writable.set()
        _drop_transport_cycle(self.transport)
        if self.worker is not None:
            # Dropped: the cancelled task keeps its CancelledError, whose traceback holds our
            # frames, so a reference back to it would make every closed connection cyclic
            # garbage, freed only by a full collection.
            self.worker, worker = None, self.worker
            worker.cancel()

    def pause_writing(self):
        self.writable.clear()

    def resume_writing(self):
        self.last_active = time.monotonic()
        self.writable.set()

    # request processing ------------------------------------------------------------
    def close(self, reason: str | None = None):
        if reason:
            log.warning("closing connection %s from %s: %s", self.id, self.peer, reason)
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def _serve(self):
        """The worker: one request at a time, in order, until none is left (see `worker`). A
        failure here must not leave the connection open unanswered: it is closed (caught here,
        not in a done callback, which would be two more objects per request in flight)."""
        try:
            while self.pending and not self.closed:
                frame = self.pending.popleft()
                self._update_reading()
                self.what = "an undecoded request"
                try:
                    await timed(self._handle(frame), self)
                finally:
                    self.handling = False
                    self.last_active = time.monotonic()
                    self.memory.release(len(frame))
        except Exception as exc:
            log.error("request loop of connection %s from %s failed, closing it: %s: %s", self.id, self.peer,
                      type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            if not self.closed:
                self.close()
            return
        self.worker = None  # in the same step that found `pending` empty: the next frame starts another

    async def _handle(self, frame: bytes | memoryview):
        """Decode, handle and answer one request; on any failure close the connection with one log line."""
        self.handling = True
        try:
            if len(frame) < _DECODE_ON_LOOP_BYTES or (
                    frame[:2] == _PRODUCE_KEY
                    and produce_entries(frame, int.from_bytes(frame[2:4], "big", signed=True),
                                        _PRODUCE_ENTRIES_ON_LOOP) < _PRODUCE_ENTRIES_ON_LOOP):
                request = decode_request(frame, self.broker.supported_versions)
            else:
                # 16 KiB of requests can be a thousand elements or more: walking and parsing
                # them takes tens of ms (100 ms and more for 128 KiB), which in a worker thread the event loop shares
                # (the GIL switches every 5 ms). Produce frames are large because of their
                # record bytes, which cost nothing to walk, so they stay on the loop unless
                # they name many partitions (200,000 in 2.4 MB: 160 ms to decode).
                request = await asyncio.to_thread(decode_request, frame, self.broker.supported_versions)
        except UnsupportedApiVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                await self._send(encode_response(API_VERSIONS_KEY, 0, exc.correlation_id,
                                                 self._unsupported_api_versions()))
                return
            self.close(str(exc))
            return
        except ProtocolViolation as exc:
            self.close(f"protocol violation: {exc}")
            return
        context = RequestContext(self.broker, request.api_key, request.api_version, request.header, self.id,
                                 self.peer_host)
        what = self.what = f"{api_name(request.api_key)} v{request.api_version}"
        link = self.broker.controller_link
        if link is not None and not link.metadata_received.is_set() and request.api_key not in _BEFORE_THE_CLUSTER:
            # Until then this broker knows itself alone (it listens once registered, and the
            # controller's UpdateMetadata follows): a Metadata answer naming only it makes
            # librdkafka drop the other brokers, coordinators included, and a
            # send_offsets_to_transaction() then hangs (librdkafka #5511, #5456). It must
            # listen to hear the controller, so clients wait instead.
            await link.metadata_received.wait()
        try:
            response = await self.broker.handlers[request.api_key].handle(context, request.body)
        except asyncio.CancelledError:
            raise
        except CloseConnection as exc:
            self.close(str(exc))
            return
        except Exception as exc:
            # One line; the traceback only when debugging (a hostile client must not flood the log).
            log.error("%s handler failed on connection %s from %s, closing it: %s: %s", what, self.id,
                      self.peer, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            self.close()
            return
        self.handling = False
        if response is None:  # Produce with acks=0 has no response
            return
        try:
            if type(response) is not EncodedBody and _many_items(response):
                chunks = await asyncio.to_thread(encode_response, request.api_key, request.api_version,
                                                 request.correlation_id, response)
            else:
                chunks = encode_response(request.api_key, request.api_version, request.correlation_id, response)
        except Exception as exc:
            # The client would wait forever for an answer that never comes: tell it by closing.
            log.error("cannot encode the %s response on connection %s from %s, closing it: %s: %s", what,
                      self.id, self.peer, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            self.close()
            return
        await self._send(chunks)

    async def _send(self, chunks: list):
        """Write a response a slice at a time, waiting for the transport to drain between slices.

        asyncio's transport (3.11) keeps what the socket did not take in one bytearray and cuts
        the sent part off its front after every send: a fetch response of tens of MB handed to
        it whole is copied and moved again for every few hundred KB the socket takes. Fetched
        records kept in their file (FileRecords) are read a slice at a time, only once the
        socket took the previous one, so an unread response holds one slice of memory; records
        down-converted for Fetch v0-3 (LazyDownConversion) are converted a group at a time.
        """
        for chunk in chunks:
            if isinstance(chunk, LazyDownConversion):
                for group in chunk.groups:
                    data = None
                    if chunk.needs_read(group):
                        data = await self._records_slice(chunk.source, group[0], group[1] - group[0])
                        if data is None:
                            return
                    try:
                        converted = chunk.convert(data, group)
                    except (KafkaError, ValueError) as exc:
                        self.close(f"response cut short: down-conversion failed: {exc}")
                        return
                    del data
                    if not await self._write(memoryview(converted)):
                        return
            elif isinstance(chunk, FileRecords):
                for start in range(0, len(chunk), _WRITE_SLICE_BYTES):
                    piece = await self._records_slice(chunk, start, min(_WRITE_SLICE_BYTES, len(chunk) - start))
                    if piece is None or not await self._write(piece):
                        return
            elif not await self._write(memoryview(chunk)):
                return

    async def _records_slice(self, records, start: int, length: int):
        """`length` bytes of fetched records (a FileRecords, or bytes in memory) from `start`;
        None when the connection is gone or was closed because the records were."""
        if not isinstance(records, FileRecords):
            return memoryview(records)[start:start + length]
        if self.closed or self.transport.is_closing():
            return None
        try:
            piece = await records.read_off_loop(start, length)
        except RecordsGone as exc:  # the frame cannot be completed: Kafka closes too
            self.close(f"response cut short: {exc}")
            return None
        return piece

    async def _write(self, view) -> bool:
        """Hand `view` to the transport a slice at a time, each once the one before drained;
        False when the peer is gone (connection_lost may only have been scheduled yet)."""
        for start in range(0, len(view), _WRITE_SLICE_BYTES):
            if self.closed or self.transport.is_closing():
                return False
            self.transport.write(view[start:start + _WRITE_SLICE_BYTES])
            self.last_active = time.monotonic()
            if not self.writable.is_set():
                await self.writable.wait()
        return True

    def _unsupported_api_versions(self) -> ApiVersionsResponse:
        # Imported here: a kio message module costs a few ms of every broker start, and this
        # answer is rare (a client asking for an ApiVersions version we do not have).
        from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse

        return ApiVersionsResponse(
            error_code=ErrorCode.unsupported_version,
            api_keys=tuple(
                ApiVersion(api_key=i16(key), min_version=i16(low), max_version=i16(high))
                for key, (low, high) in sorted(self.broker.supported_versions.items())
            ),
        )
