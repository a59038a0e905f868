"""A broker's membership in a ZooKeeper cluster (`zookeeper.connect` set).

Start-up, in Kafka's order: connect (a ZooKeeper that does not answer within
`zookeeper.connection.timeout.ms`, or a chroot that does not exist, stops the broker),
take the cluster id from `/cluster/id`, hand out producer ids from
`/latest_producer_id_block`, and once the listener is bound register
`/brokers/ids/<broker.id>`. A registration already there may be this broker's own from
before a kill -9, alive until its session times out: Kafka then fails to start
(KAFKA-7165); Ottla waits up to a session timeout for it to go, and only a registration
that outlives that (another live broker with this id) stops this one. When the
ZooKeeper session expires its registration is gone; it is created again in the new
session, as Kafka's session-expiration handler does. Without `zookeeper.connect` none of
this exists and the broker runs alone.
"""

from __future__ import annotations

import asyncio
import logging

from ..config import BrokerConfig
from ..producer_state.allocator import ProducerIdBlockStore
from .store import BrokerIdInUse, BrokerRegistration, ClusterStore, StoreError

log = logging.getLogger("ottla.cluster")

REREGISTER_BACKOFF_S = 1.0
REGISTRATION_POLL_S = 0.2


class ClusterMembership:
    def __init__(self, store: ClusterStore, broker_id: int, rack: str | None, *, session_timeout_ms: int):
        self.store = store
        self.session_timeout_ms = session_timeout_ms
        self.broker_id = broker_id
        self.rack = rack
        self.registration: BrokerRegistration | None = None
        self._closed = False

    @classmethod
    def join(cls, config: BrokerConfig) -> "ClusterMembership | None":
        """Connect to ZooKeeper (blocking); None when the broker runs alone."""
        connect = config["zookeeper.connect"]
        if not connect:
            return None
        from .zk import ZkClusterStore  # kazoo: loaded by cluster brokers only

        store = ZkClusterStore(connect, session_timeout_ms=config["zookeeper.session.timeout.ms"],
                               connection_timeout_ms=config["zookeeper.connection.timeout.ms"])
        return cls(store, config["broker.id"], config["broker.rack"],
                   session_timeout_ms=config["zookeeper.session.timeout.ms"])

    def cluster_id(self, proposed: str) -> str:
        return self.store.cluster_id(proposed)

    def producer_id_blocks(self) -> ProducerIdBlockStore:
        from .zk import ZkProducerIdBlockStore

        return ZkProducerIdBlockStore(self.store)

    def register(self, host: str, port: int) -> BrokerRegistration:
        """Blocking; raises BrokerIdInUse when another live broker holds this id."""
        self.registration = self.store.register_broker(BrokerRegistration(self.broker_id, host, port, self.rack))
        log.info("registered broker %d at %s:%d in ZooKeeper (broker epoch %d)",
                 self.broker_id, host, port, self.registration.epoch)
        return self.registration

    async def start(self, host: str, port: int) -> None:
        """Register, and register again after every session expiry until closed."""
        loop = asyncio.get_running_loop()
        # The previous incarnation's session ends at most a session timeout after it died;
        # ZooKeeper checks expiry once a tick, hence the margin.
        deadline = loop.time() + self.session_timeout_ms / 1000 * 1.2 + 1.0
        while True:
            try:
                await loop.run_in_executor(None, self.register, host, port)
                break
            except BrokerIdInUse:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(REGISTRATION_POLL_S)
        self.store.on_session_lost(
            lambda: loop.call_soon_threadsafe(lambda: loop.create_task(self._reregister(host, port))))

    async def _reregister(self, host: str, port: int) -> None:
        log.warning("ZooKeeper session of broker %d expired; registering again", self.broker_id)
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                await loop.run_in_executor(None, self.register, host, port)
                return
            except StoreError as exc:
                log.warning("re-registering broker %d failed (%s); retrying", self.broker_id, exc)
                await asyncio.sleep(REREGISTER_BACKOFF_S)

    def close(self) -> None:
        """Ends the session: the registration goes at once (a clean shutdown)."""
        self._closed = True
        self.store.close()
