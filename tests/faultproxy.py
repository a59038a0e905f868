"""A fault-injecting TCP proxy that speaks Kafka framing, for tests that need a broker to misbehave.

The proxy runs its own asyncio loop in a background thread, so blocking Kafka clients in the
test thread can talk through it. It reads whole frames (4-byte big-endian size prefix) in both
directions and pairs each response with its request by correlation id, which is what lets it
drop the *response* to a request the broker has already processed -- the case idempotent and
transactional producers must survive.

Clients learn broker addresses from Metadata (and coordinators from FindCoordinator), so after
bootstrap they would connect to the broker directly and bypass the proxy. Two ways around that:

* start the proxy first, then the broker with ``--advertised <proxy.address>``, and point the
  proxy at the broker afterwards (``proxy.upstream = (host, port)``); or
* ``FaultProxy(..., rewrite_addresses=True)``: the proxy rewrites every broker/coordinator
  address in Metadata, FindCoordinator and DescribeCluster responses to its own. That maps all
  brokers onto one port, so it only suits single-broker upstreams (Ottla, a 1-broker mock).

Decisions are drawn from one ``random.Random`` per connection, seeded from ``seed`` and the
connection's accept number, so a run replays the same faults for the same traffic.

Example, with Ottla advertising the proxy::

    with FaultProxy(seed=7) as proxy:
        broker = BrokerProcess(tmp_path / "data", extra_args=["--advertised", proxy.address]).start()
        proxy.upstream = ("127.0.0.1", broker.port)
        proxy.drop_responses(0.2, api_key=PRODUCE)          # drop 20% of Produce responses
        producer = Producer({"bootstrap.servers": proxy.address, "enable.idempotence": True})
        ...
        assert proxy.stats["dropped_responses"] > 0 and proxy.errors == []

(``BrokerProcess`` is ``ottla.testing.BrokerProcess``; stop it in a ``finally``.)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import io
import random
import struct
import threading
import kio.index
import kio.serial

PRODUCE = 0
FETCH = 1
METADATA = 3
FIND_COORDINATOR = 10
API_VERSIONS = 18
DESCRIBE_CLUSTER = 60

# Responses whose host/port fields tell the client where to connect next.
_ADDRESS_APIS = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})
# Anything bigger is not a Kafka frame we want to buffer; treat it as a broken stream.
_MAX_FRAME = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class _DropRule:
    rate: float
    api_key: int | None
    close: bool
    client_id: str | None = None


@dataclasses.dataclass(frozen=True)
class _DelayRule:
    seconds: float
    jitter: float
    api_key: int | None


class _CutConnection(Exception):
    """Raised inside a pump to tear down both sides of one proxied connection."""


class _Connection:
    def __init__(self, number: int, rng: random.Random, client: asyncio.StreamWriter) -> None:
        self.number = number
        self.rng = rng
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        # (correlation_id, api_key, api_version, client_id) of requests still waiting for a response.
        self.pending: collections.deque[tuple[int, int, int, str | None]] = collections.deque()
        self.tasks: list[asyncio.Task] = []

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.is_closing():
                writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    def take_request(self, correlation_id: int) -> tuple[int, int, str | None] | None:
        """Pop the request this response answers. Responses come back in request order;
        skipped entries were requests without a response (Produce with acks=0)."""
        while self.pending:
            cid, api_key, api_version, client_id = self.pending.popleft()
            if cid == correlation_id:
                return api_key, api_version, client_id
        return None


class FaultProxy:
    """Forwards ``listen_host:listen_port`` to ``upstream`` and injects faults on request.

    All fault settings may be changed at any time from the test thread; they apply to frames
    handled afterwards. ``stats`` counts what the proxy did.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | None = None,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int = 0,
        rewrite_addresses: bool = False,
    ) -> None:
        self.upstream = upstream
        self.listen_host = listen_host
        self.seed = seed
        self.rewrite_addresses = rewrite_addresses
        self.stats: collections.Counter[str] = collections.Counter()
        # (api_key, api_version) of every request forwarded: what version a client chose.
        self.requests: collections.Counter[tuple[int, int]] = collections.Counter()
        # Unexpected exceptions inside the proxy (e.g. a response kio cannot parse); tests
        # should assert this stays empty.
        self.errors: list[Exception] = []
        self._requested_port = listen_port
        self._port: int | None = None
        self._drop: _DropRule | None = None
        self._delay: _DelayRule | None = None
        self._cut_rate = 0.0
        self._record: tuple[int, str | None] | None = None
        # Request frames (without the size prefix) passed upstream while `record_requests` is on.
        self.recorded: list[bytes] = []
        self._connections: set[_Connection] = set()
        self._accepted = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen and serve in a new thread. After stop(), start() takes the same port again,
        so stop/start looks to clients like the broker going away and coming back."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, self.listen_host, self._requested_port)
                )
            except BaseException as exc:  # reported to start() in the calling thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            self._port = self._requested_port = self._server.sockets[0].getsockname()[1]
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"faultproxy-{id(self):x}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close the listener and every proxied connection, then end the loop thread."""
        if self._thread is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError("fault proxy thread did not stop")
        self._thread = self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` to give clients as bootstrap (or the broker as ``--advertised``)."""
        return f"{self.listen_host}:{self.port}"

    # -- faults ------------------------------------------------------------------------------

    def drop_responses(self, rate: float, *, api_key: int | None = None, close: bool = True,
                       client_id: str | None = None) -> None:
        """Drop this share of responses (of ``api_key`` only, and to requests with that
        ``client_id`` only, if given) after the broker has handled the request. ``close=True``
        then cuts the connection so the client notices and retries at once; ``close=False``
        keeps it open and the client waits for its request timeout."""
        self._drop = _DropRule(rate, api_key, close, client_id) if rate > 0 else None

    def delay_responses(self, seconds: float, *, jitter: float = 0.0, api_key: int | None = None) -> None:
        """Hold responses for ``seconds`` plus up to ``jitter`` more. Order is kept, so a
        delayed response also delays the ones after it on the same connection."""
        self._delay = _DelayRule(seconds, jitter, api_key) if seconds > 0 or jitter > 0 else None

    def cut_randomly(self, rate: float) -> None:
        """Cut a connection instead of forwarding a frame, with this probability per frame
        (requests and responses alike)."""
        self._cut_rate = rate

    def record_requests(self, api_key: int, *, client_id: str | None = None) -> None:
        """Keep a copy of each request frame of `api_key` (from `client_id`) in `recorded`."""
        self._record = (api_key, client_id)

    def clear_faults(self) -> None:
        self._drop = None
        self._delay = None
        self._cut_rate = 0.0

    def cut_all(self) -> int:
        """Cut every open connection now; returns how many were cut."""
        if self._loop is None:
            raise RuntimeError("proxy not started")
        return asyncio.run_coroutine_threadsafe(self._cut_all(), self._loop).result(timeout=10)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- loop side ---------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut_all(count=False)
        if self._server is not None:
            await self._server.wait_closed()
        tasks = [t for c in list(self._connections) for t in c.tasks]
        tasks += [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _cut_all(self, count: bool = True) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.close()
        if count:
            self.stats["cuts_on_demand"] += len(connections)
        return len(connections)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self._accepted
        self._accepted += 1
        self.stats["connections"] += 1
        connection = _Connection(number, random.Random(f"{self.seed}/{number}"), writer)
        self._connections.add(connection)
        try:
            if self.upstream is None:
                self.stats["refused_no_upstream"] += 1
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                self.stats["upstream_connect_failures"] += 1
                return
            connection.upstream = up_writer
            connection.tasks = [
                asyncio.ensure_future(self._pump_requests(connection, reader, up_writer)),
                asyncio.ensure_future(self._pump_responses(connection, up_reader, writer)),
            ]
            # Either side ending (EOF, error, injected cut) ends the proxied connection.
            await asyncio.wait(connection.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            connection.close()
            if connection.tasks:
                await asyncio.gather(*connection.tasks, return_exceptions=True)
            self._connections.discard(connection)

    def _maybe_cut(self, connection: _Connection) -> None:
        if self._cut_rate > 0 and connection.rng.random() < self._cut_rate:
            self.stats["random_cuts"] += 1
            raise _CutConnection

    async def _pump_requests(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                frame = await _read_frame(reader)
                if frame is None:
                    return
                if len(frame) < 8:
                    raise _CutConnection
                api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
                self._maybe_cut(connection)
                connection.pending.append((correlation_id, api_key, api_version, _client_id(frame)))
                record = self._record
                if record is not None and record[0] == api_key and record[1] in (None, _client_id(frame)):
                    self.recorded.append(frame)
                self.stats["requests"] += 1
                self.requests[(api_key, api_version)] += 1
                writer.write(struct.pack(">i", len(frame)) + frame)
                await writer.drain()
        except (_CutConnection, ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception as exc:  # a proxy bug must fail the test, not just drop a connection
            self.errors.append(exc)

    async def _pump_responses(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                frame = await _read_frame(reader)
                if frame is None:
                    return
                if len(frame) < 4:
                    raise _CutConnection
                (correlation_id,) = struct.unpack_from(">i", frame)
                request = connection.take_request(correlation_id)
                api_key, api_version, client_id = request if request is not None else (None, None, None)
                self._maybe_cut(connection)

                drop = self._drop
                if (drop is not None and drop.api_key in (None, api_key) and drop.client_id in (None, client_id)
                        and connection.rng.random() < drop.rate):
                    self.stats["dropped_responses"] += 1
                    if drop.close:
                        self.stats["cuts_after_drop"] += 1
                        raise _CutConnection
                    continue

                delay = self._delay
                if delay is not None and delay.api_key in (None, api_key):
                    self.stats["delayed_responses"] += 1
                    await asyncio.sleep(delay.seconds + delay.jitter * connection.rng.random())

                if self.rewrite_addresses and api_key in _ADDRESS_APIS:
                    frame = self._rewrite(frame, api_key, api_version)

                self.stats["responses"] += 1
                writer.write(struct.pack(">i", len(frame)) + frame)
                await writer.drain()
        except (_CutConnection, ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception as exc:  # a proxy bug must fail the test, not just drop a connection
            self.errors.append(exc)

    def _rewrite(self, frame: bytes, api_key: int, api_version: int) -> bytes:
        schema = kio.index.load_response_schema(api_key, api_version)
        # kio readers return (entity, bytes consumed from the given offset). Bytes after the
        # body are kept as they are: librdkafka's mock cluster, for one, ends Metadata v13
        # with an extra byte.
        _, offset = kio.serial.entity_reader(schema.__header_schema__)(frame, 0)
        body, size = kio.serial.entity_reader(schema)(frame, offset)
        rewritten = _replace_addresses(body, self.listen_host, self.port)
        if rewritten is body:
            return frame
        self.stats["rewritten_responses"] += 1
        return frame[:offset] + _serialize(schema, rewritten) + frame[offset + size :]


def _client_id(frame: bytes) -> str | None:
    """The request header's client id (a nullable INT16-length string in every header version)."""
    if len(frame) < 10:
        return None
    (size,) = struct.unpack_from(">h", frame, 8)
    return None if size < 0 else frame[10:10 + size].decode("utf-8", "replace")


def _serialize(schema: type, entity: object) -> bytes:
    buffer = io.BytesIO()
    kio.serial.entity_writer(schema)(buffer, entity)
    return buffer.getvalue()


def _replace_addresses(entity: object, host: str, port: int) -> object:
    """Return ``entity`` with host/port of every real broker (node id >= 0) set to the proxy;
    the same object when nothing changed."""
    if not dataclasses.is_dataclass(entity):
        return entity
    changes: dict[str, object] = {}
    names = {f.name for f in dataclasses.fields(entity)}
    if {"host", "port"} <= names and getattr(entity, "node_id", 0) >= 0 and entity.port >= 0:
        if (entity.host, entity.port) != (host, port):
            changes["host"] = host
            changes["port"] = type(entity.port)(port)
    for name in names - {"host", "port"}:
        value = getattr(entity, name)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            replaced = tuple(_replace_addresses(item, host, port) for item in value)
            if any(new is not old for new, old in zip(replaced, value)):
                changes[name] = replaced
    return dataclasses.replace(entity, **changes) if changes else entity


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One frame without its size prefix; None on a clean EOF between frames."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    (size,) = struct.unpack(">i", prefix)
    if size < 0 or size > _MAX_FRAME:
        raise _CutConnection
    return await reader.readexactly(size)

