"""What a broker of a cluster does besides its membership: stand for controller, follow the
controller's requests, and hand its leadership away before a clean stop.

Every broker runs a `ControllerService` (it acts while this broker holds `/controller`) and
a `ControllerLink` (this broker's side of LeaderAndIsr, UpdateMetadata and StopReplica).
The controller's requests go out on the broker's inter-broker client, to the endpoints the
controller read from `/brokers/ids` (the service keeps them in order per broker). On
SIGTERM with `controlled.shutdown.enable` the broker first asks the controller to move its
leadership away (ControlledShutdown), up to `controlled.shutdown.max.retries` times,
`controlled.shutdown.retry.backoff.ms` apart, as Kafka's `KafkaServer.controlledShutdown`
does; then it stops. The controller is found in the metadata cache, as Kafka finds it, not
in ZooKeeper: a broker whose ZooKeeper is unreachable stops promptly, skipping the
controlled shutdown (the controller moves leadership by writing to ZooKeeper, and will see
this broker gone when its session ends).
"""

from __future__ import annotations

import asyncio
import logging

from ..controller import ControllerConfig, wire
from ..controller.requests import ControllerRequest
from ..controller.service import ControllerService
from ..errors import ErrorCode
from ..failpoints import from_environment as failpoints_from_environment
from .controller_link import ControllerLink
from .interbroker import BrokerNotAvailable, InterBrokerClient
from .isr_updates import IsrUpdates
from .replica_fetcher import ReplicaFetcherManager

__all__ = ["ClusterNode"]

log = logging.getLogger("ottla.cluster")

# Failpoint (ottla.failpoints), not a crash: the broker lingers a second after its controlled
# shutdown succeeded, as a controller resigning on a loaded machine does.
HOLD_AFTER_CONTROLLED_SHUTDOWN = "shutdown.hold_after_controlled_shutdown"


class ClusterNode:
    def __init__(self, broker):
        self.broker = broker
        self.store = broker.membership.store
        self.link = ControllerLink(broker, self.store)
        self.service = ControllerService(broker.node_id, self.store,
                                         ControllerConfig.from_broker_config(broker.config), self._send)
        # The controller's own connections (Kafka's ControllerChannelManager has its own): a
        # broker answers one request per connection at a time, and a WriteTxnMarkers waiting
        # up to 30 s for acks=all on a leader with a stale ISR must not hold up the
        # LeaderAndIsr that would unblock it (seen in `python -m ottla.demo --brokers 3`).
        self.client = InterBrokerClient(f"broker-{broker.node_id}-controller")
        # The fetchers' own connections (Kafka's replica fetcher threads have theirs): a
        # long-polling Fetch must not hold up the controller's requests to the same broker.
        self.fetcher_client = InterBrokerClient(f"broker-{broker.node_id}-fetcher-0",
                                                request_timeout_ms=broker.config["replica.socket.timeout.ms"])
        self.fetchers = ReplicaFetcherManager(broker, self.fetcher_client)
        self.isr_updates = IsrUpdates(broker.replicas, self.store)

    def attach(self) -> None:
        """Answer the controller before registering: its first UpdateMetadata and LeaderAndIsr
        follow the registration at once, and one refused for want of a link is not resent."""
        self.broker.replicas.fetchers = self.fetchers
        self.isr_updates.start()
        self.broker.controller_link = self.link
        self.broker.controller_service = self.service

    async def start(self) -> None:
        """Once registered: stand for controller."""
        await self.service.start()

    async def _send(self, request: ControllerRequest):
        ctx = self.service.controller.ctx
        registration = None if ctx is None else ctx.brokers.get(request.destination)
        if registration is None:
            raise BrokerNotAvailable(f"broker {request.destination} is not live")
        _, _, message = wire.to_message(request)
        response = await self.client.send(request.destination, registration.host, registration.port, message)
        if response.error_code:
            log.warning("controller: broker %d refused %s (%s)", request.destination, request.kind,
                        ErrorCode(response.error_code).name.upper())
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
                controller_id = self.broker.metadata.controller_id
                target = self.broker.metadata.broker(controller_id)
                if target is None:
                    raise BrokerNotAvailable("no controller")
                _, _, message = wire.controlled_shutdown_request(self.broker.node_id, self.link.broker_epoch())
                response = await self.client.send(controller_id, target.host, target.port, message)
                remaining = [(p.topic_name, int(p.partition_index)) for p in response.remaining_partitions]
                if response.error_code == ErrorCode.none and not remaining:
                    log.info("controlled shutdown of broker %d succeeded", self.broker.node_id)
                    return True
                log.info("controlled shutdown of broker %d: %s, %d partitions still led",
                         self.broker.node_id, ErrorCode(response.error_code).name, len(remaining))
            except (OSError, asyncio.TimeoutError) as exc:
                log.info("controlled shutdown of broker %d: attempt %d failed (%s)",
                         self.broker.node_id, attempt + 1, exc)
            if attempt + 1 < retries:
                await asyncio.sleep(backoff_s)
        log.warning("Proceeding to do an unclean shutdown as all the controlled shutdown attempts failed")
        return False

    async def stop(self, *, registered: bool = True) -> None:
        self.fetchers.shutting_down()
        if registered and self.broker.config["controlled.shutdown.enable"]:
            if self.store.connected:
                if await self.controlled_shutdown() and HOLD_AFTER_CONTROLLED_SHUTDOWN in failpoints_from_environment():
                    await asyncio.sleep(1.0)
            else:
                log.warning("ZooKeeper is unreachable: broker %d stops without a controlled shutdown",
                            self.broker.node_id)
        await self.service.stop()
        self.broker.replicas.fetchers = None
        await self.fetchers.stop()
        await self.isr_updates.stop()
        await self.fetcher_client.close()
        await self.client.close()
