"""What a broker of a cluster does besides its membership: stand for controller, follow the
controller's requests, and hand its leadership away before a clean stop.

Every broker runs a `ControllerService` (it acts while this broker holds `/controller`) and
a `ControllerLink` (this broker's side of LeaderAndIsr, UpdateMetadata and StopReplica).
The controller's requests go out to the endpoints the controller read from `/brokers/ids`,
one connection per broker, each request answered before the next is sent (the service
keeps them in order per broker). On SIGTERM with `controlled.shutdown.enable` the broker
first asks the controller to move its leadership away (ControlledShutdown), up to
`controlled.shutdown.max.retries` times, `controlled.shutdown.retry.backoff.ms` apart, as
Kafka's `KafkaServer.controlledShutdown` does; then it stops.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer

from ..controller import ControllerConfig, wire
from ..controller.requests import ControllerRequest
from ..controller.service import ControllerService
from ..errors import ErrorCode
from ..protocol.schemas import response_schema
from .controller_link import ControllerLink
from .isr_updates import IsrUpdates
from .replica_fetcher import ReplicaFetcherManager

__all__ = ["ClusterNode"]

log = logging.getLogger("ottla.cluster")

REQUEST_TIMEOUT_S = 30.0
_SIZE = struct.Struct(">i")


class _Channel:
    """One connection to one broker, a request at a time (Kafka's `RequestSendThread`)."""

    def __init__(self, host: str, port: int, client_id: str):
        self.endpoint = (host, port)
        self._client_id = client_id
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = itertools.count(1)
        self._lock = asyncio.Lock()

    async def send(self, api_key: int, version: int, message: Any) -> Any:
        async with self._lock:
            try:
                return await asyncio.wait_for(self._round_trip(api_key, version, message), REQUEST_TIMEOUT_S)
            except BaseException:
                self.close()
                raise

    async def _round_trip(self, api_key: int, version: int, message: Any) -> Any:
        if self._streams is None:
            self._streams = await asyncio.open_connection(*self.endpoint)
        reader, writer = self._streams
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        header_type = type(message).__header_schema__
        out = io.BytesIO()
        entity_writer(header_type)(out, header_type(request_api_key=api_key, request_api_version=version,
                                                    correlation_id=correlation_id, client_id=self._client_id))
        entity_writer(type(message))(out, message)
        writer.write(_SIZE.pack(out.tell()) + out.getvalue())
        await writer.drain()
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        frame = await reader.readexactly(size)
        schema = response_schema(api_key, version)
        header, offset = entity_reader(schema.__header_schema__)(frame, 0)
        if header.correlation_id != correlation_id:
            raise ConnectionError(f"response to correlation id {header.correlation_id}, not {correlation_id}")
        return entity_reader(schema)(frame, offset)[0]

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class ClusterNode:
    def __init__(self, broker):
        self.broker = broker
        self.store = broker.membership.store
        self.link = ControllerLink(broker, self.store)
        self.service = ControllerService(broker.node_id, self.store,
                                         ControllerConfig.from_broker_config(broker.config), self._send)
        self._channels: dict[int, _Channel] = {}
        self.fetchers = ReplicaFetcherManager(broker, broker.interbroker)
        self.isr_updates = IsrUpdates(broker.replicas, self.store)

    async def start(self) -> None:
        # Replication first: the controller's first LeaderAndIsr may follow at once.
        self.broker.replicas.fetchers = self.fetchers
        self.isr_updates.start()
        self.broker.controller_link = self.link
        self.broker.controller_service = self.service
        await self.service.start()

    def _channel(self, broker_id: int, host: str, port: int) -> _Channel:
        channel = self._channels.get(broker_id)
        if channel is None or channel.endpoint != (host, port):
            if channel is not None:
                channel.close()
            channel = self._channels[broker_id] = _Channel(host, port, f"controller-{self.broker.node_id}")
        return channel

    async def _send(self, request: ControllerRequest):
        ctx = self.service.controller.ctx
        registration = None if ctx is None else ctx.brokers.get(request.destination)
        if registration is None:
            raise ConnectionError(f"broker {request.destination} is not live")
        api_key, version, message = wire.to_message(request)
        response = await self._channel(request.destination, registration.host, registration.port).send(
            api_key, version, message)
        if request.kind == "StopReplica":
            return wire.stop_replica_errors(request, response)
        return None

    async def controlled_shutdown(self) -> bool:
        """Ask the controller to move leadership off this broker; True once it has."""
        config = self.broker.config
        retries = config["controlled.shutdown.max.retries"]
        backoff_s = config["controlled.shutdown.retry.backoff.ms"] / 1000
        for attempt in range(retries):
            try:
                controller_id = await asyncio.to_thread(self.store.controller_id)
                brokers = await asyncio.to_thread(self.store.live_brokers)
                target = brokers.get(controller_id) if controller_id is not None else None
                if target is None:
                    raise ConnectionError("no controller")
                api_key, version, message = wire.controlled_shutdown_request(self.broker.node_id,
                                                                           self.link.broker_epoch())
                response = await self._channel(controller_id, target.host, target.port).send(
                    api_key, version, message)
                remaining = [(p.topic_name, int(p.partition_index)) for p in response.remaining_partitions]
                if response.error_code == ErrorCode.none and not remaining:
                    log.info("controlled shutdown of broker %d succeeded", self.broker.node_id)
                    return True
                log.info("controlled shutdown of broker %d: %s, %d partitions still led",
                         self.broker.node_id, ErrorCode(response.error_code).name, len(remaining))
            except (OSError, EOFError, asyncio.TimeoutError) as exc:
                log.info("controlled shutdown of broker %d: attempt %d failed (%s)",
                         self.broker.node_id, attempt + 1, exc)
            if attempt + 1 < retries:
                await asyncio.sleep(backoff_s)
        log.warning("Proceeding to do an unclean shutdown as all the controlled shutdown attempts failed")
        return False

    async def stop(self) -> None:
        if self.broker.config["controlled.shutdown.enable"]:
            await self.controlled_shutdown()
        await self.service.stop()
        self.broker.replicas.fetchers = None
        await self.fetchers.stop()
        await self.isr_updates.stop()
        for channel in self._channels.values():
            channel.close()
