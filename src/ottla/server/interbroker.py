"""An asyncio client for broker-to-broker requests, on the server's own codec (Kafka's
`NetworkClient` as the controller channel, replica fetchers and marker sender use it).

One connection per destination broker; requests are pipelined on it and matched to their
responses by correlation id. A request that gets no answer within its timeout fails with
`RequestTimedOut` and closes the connection (as Kafka's client does: the answer may still
arrive and must not be taken for the next request's). A broker that cannot be reached fails
the send with `BrokerNotAvailable`; the next send to it waits out a backoff that doubles
from `reconnect_backoff_ms` to `reconnect_backoff_max_ms` (Kafka's names and defaults) and
reconnects. Every request sent here expects a response (no acks=0 produce).

A sender that picks its request's version by what the other broker serves asks
`usable_version`: the highest version both ends support, from that broker's ApiVersions,
asked once per connection (Kafka's NetworkClient asks on every new connection; here only
when a sender needs it) and asked again after a reconnect, since the broker may have been
upgraded or downgraded meanwhile.

Timeouts use `asyncio.timeout`, never `asyncio.wait_for`: Python 3.11's `wait_for` returns
the result when its task is cancelled just as the answer arrives, so the cancellation is
lost. A replica fetcher cancelled that way went on fetching, and the broker never finished
its SIGTERM.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from typing import Any

from ..errors import ErrorCode
from ..protocol.codec import ProtocolViolation, decode_response, encode_request, response_correlation_id

__all__ = ["InterBrokerClient", "BrokerConnection", "BrokerNotAvailable", "RequestTimedOut", "UnsupportedVersion",
           "highest_common_version"]

log = logging.getLogger("ottla.interbroker")

_SIZE = struct.Struct(">i")


class BrokerNotAvailable(ConnectionError):
    """The destination broker cannot be reached (or the connection broke under the request)."""


class RequestTimedOut(TimeoutError):
    pass


class UnsupportedVersion(Exception):
    """The other broker serves no version of the API that this one can send (Kafka's
    UnsupportedVersionException)."""


def highest_common_version(api_key: int, ours: tuple[int, int], theirs: dict[int, tuple[int, int]]) -> int:
    """Kafka's `NodeApiVersions.latestUsableVersion`: the highest version in both ranges."""
    if api_key not in theirs:
        raise UnsupportedVersion(f"the broker does not serve API key {api_key}")
    low, high = max(ours[0], theirs[api_key][0]), min(ours[1], theirs[api_key][1])
    if low > high:
        raise UnsupportedVersion(f"API key {api_key}: the broker serves v{theirs[api_key][0]}-{theirs[api_key][1]}, "
                                 f"this one sends v{ours[0]}-{ours[1]}")
    return high


class BrokerConnection:
    """The connection to one broker, opened on demand and reopened after a failure."""

    def __init__(self, node_id: int, host: str, port: int, *, client_id: str, request_timeout_ms: int,
                 reconnect_backoff_ms: int, reconnect_backoff_max_ms: int, max_response_bytes: int):
        self.node_id = node_id
        self.host, self.port = host, port
        self._client_id = client_id
        self._timeout_s = request_timeout_ms / 1000
        self._backoff_min_s = reconnect_backoff_ms / 1000
        self._backoff_max_s = reconnect_backoff_max_ms / 1000
        self._backoff_s = self._backoff_min_s
        self._max_response = max_response_bytes
        self._next_attempt = 0.0  # monotonic time before which no reconnect is tried
        self._correlation = itertools.count(1)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._connecting: asyncio.Future | None = None
        self._pending: dict[int, tuple[asyncio.Future, int, int]] = {}
        # Requests whose sender was cancelled: their answers still come, and are dropped.
        self._abandoned: set[int] = set()
        self._closed = False
        self._api_versions: dict[int, tuple[int, int]] | None = None  # the broker's, on this connection

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def _connect(self) -> None:
        if self.connected:
            return
        if self._connecting is not None:
            await asyncio.shield(self._connecting)
            return
        self._connecting = asyncio.get_running_loop().create_future()
        try:
            delay = self._next_attempt - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(self._timeout_s):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, asyncio.TimeoutError) as exc:
                self._next_attempt = time.monotonic() + self._backoff_s
                self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
                raise BrokerNotAvailable(f"cannot connect to broker {self.node_id} at {self.host}:{self.port}: "
                                         f"{exc or type(exc).__name__}") from None
            self._backoff_s = self._backoff_min_s
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read_responses(reader, writer))
            self._connecting.set_result(None)
        except BaseException as exc:
            self._connecting.set_exception(exc if isinstance(exc, Exception) else BrokerNotAvailable("cancelled"))
            self._connecting.exception()  # retrieved: the waiters re-raise it themselves
            raise
        finally:
            self._connecting = None

    async def send(self, request: Any, timeout_ms: int | None = None) -> Any:
        """Send a kio request entity and return its response entity."""
        if self._closed:
            raise BrokerNotAvailable(f"connection to broker {self.node_id} is closed")
        await self._connect()
        if not self.connected:
            raise BrokerNotAvailable(f"connection to broker {self.node_id} broke")
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        future = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (future, request.__api_key__, request.__version__)
        self._writer.write(encode_request(request, correlation_id, self._client_id))
        timeout_s = self._timeout_s if timeout_ms is None else timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            self._disconnect(RequestTimedOut(f"no response from broker {self.node_id} in {timeout_s:.3f}s"))
            raise RequestTimedOut(f"{type(request).__name__} to broker {self.node_id} timed out after "
                                  f"{timeout_s:.3f}s") from None
        except asyncio.CancelledError:
            if correlation_id in self._pending:
                self._abandoned.add(correlation_id)
            raise
        finally:
            self._pending.pop(correlation_id, None)

    async def usable_version(self, api_key: int, ours: tuple[int, int]) -> int:
        """The highest version of `api_key` in `ours` that the broker serves (UnsupportedVersion
        if none); its ApiVersions is asked on the first call on each connection."""
        if self._api_versions is None or not self.connected:
            from kio.schema.api_versions.v3.request import ApiVersionsRequest  # kio modules cost start time

            response = await self.send(ApiVersionsRequest(client_software_name="ottla", client_software_version="1"))
            if response.error_code != ErrorCode.none:
                raise UnsupportedVersion(f"ApiVersions to broker {self.node_id} failed: {response.error_code!r}")
            self._api_versions = {v.api_key: (v.min_version, v.max_version) for v in response.api_keys}
        return highest_common_version(api_key, ours, self._api_versions)

    async def _read_responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: Exception = BrokerNotAvailable(f"broker {self.node_id} closed the connection")
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                if size < 0 or size > self._max_response:
                    raise ProtocolViolation(f"response frame of {size} bytes from broker {self.node_id}")
                frame = await reader.readexactly(size)
                correlation_id = response_correlation_id(frame)
                pending = self._pending.get(correlation_id)
                if pending is None and correlation_id in self._abandoned:
                    self._abandoned.discard(correlation_id)
                    continue
                if pending is None:
                    raise ProtocolViolation(f"response to unknown correlation id {correlation_id}")
                future, api_key, api_version = pending
                if not future.done():
                    future.set_result(decode_response(frame, api_key, api_version)[1])
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolViolation as exc:
            log.warning("closing the connection to broker %d: %s", self.node_id, exc)
            error = BrokerNotAvailable(str(exc))
        except asyncio.CancelledError:
            error = BrokerNotAvailable(f"connection to broker {self.node_id} closed")
        if self._writer is writer:
            self._disconnect(error)

    def _disconnect(self, error: Exception) -> None:
        writer, self._writer = self._writer, None
        self._api_versions = None
        if writer is not None:
            writer.close()
        task, self._reader_task = self._reader_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        pending, self._pending = self._pending, {}
        self._abandoned.clear()
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(error if isinstance(error, BrokerNotAvailable) else BrokerNotAvailable(str(error)))
                future.exception()  # the sender may have stopped waiting already

    async def close(self) -> None:
        self._closed = True
        writer, task = self._writer, self._reader_task
        self._disconnect(BrokerNotAvailable(f"connection to broker {self.node_id} closed"))
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        if writer is not None:
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass


class InterBrokerClient:
    """Connections to the other brokers, by node id; endpoints come from the metadata cache."""

    def __init__(self, client_id: str, *, request_timeout_ms: int = 30_000, reconnect_backoff_ms: int = 50,
                 reconnect_backoff_max_ms: int = 1_000, max_response_bytes: int = 100 * 1024 * 1024):
        self._client_id = client_id
        self._settings = dict(request_timeout_ms=request_timeout_ms, reconnect_backoff_ms=reconnect_backoff_ms,
                              reconnect_backoff_max_ms=reconnect_backoff_max_ms, max_response_bytes=max_response_bytes)
        self._connections: dict[int, BrokerConnection] = {}
        self._closed = False

    def connection(self, node_id: int, host: str, port: int) -> BrokerConnection:
        """The connection to `node_id`; a new endpoint for it replaces the old connection."""
        if self._closed:
            raise BrokerNotAvailable("the inter-broker client is closed")
        current = self._connections.get(node_id)
        if current is not None and (current.host, current.port) == (host, port):
            return current
        if current is not None:
            asyncio.get_running_loop().create_task(current.close())
        current = self._connections[node_id] = BrokerConnection(node_id, host, port, client_id=self._client_id,
                                                                **self._settings)
        return current

    async def send(self, node_id: int, host: str, port: int, request: Any, timeout_ms: int | None = None) -> Any:
        return await self.connection(node_id, host, port).send(request, timeout_ms)

    async def usable_version(self, node_id: int, host: str, port: int, api_key: int, ours: tuple[int, int]) -> int:
        return await self.connection(node_id, host, port).usable_version(api_key, ours)

    async def close(self) -> None:
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
