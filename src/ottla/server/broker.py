"""The broker: owns the logs, the metadata cache, the replica manager, the coordinators and
the network listener.

The core it drives (LogManager, coordinators) is plain classes; this module adds the
asyncio edges: the listener and the periodic duties (flush, producer-id expiry,
coordinator timers). Alone (no controller) it is its own controller: topic changes go to
the local catalog and from there into the metadata cache and the replica manager
(`create_topic`, `delete_topic`, `add_partitions`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import logging
import os
import signal
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..cluster.membership import ClusterMembership
from ..cluster.store import StoreError
from ..config import BrokerConfig
from ..coordinator.group.service import GroupService
from ..coordinator.transaction.service import TransactionService
from ..failpoints import from_environment as failpoints_from_environment
from ..fetch_sessions import FetchSessionCache
from ..log.cleaner.service import LogCleaner
from ..log.disk_worker import DiskWorker
from ..log.manager import LogManager, TopicInfo
from ..producer_state.allocator import FileProducerIdBlockStore, ProducerIdManager
from ..producer_state.authorizer import AllowAllAuthorizer
from .acceptor import Acceptor, bind
from .clock import now_ms
from .coordinator_runtime import BrokerCoordinatorRuntime, BrokerMarkerChannel
from .handlers import load_handlers
from .heap import release_after_connection_storms
from .connections import Connections, size_socket_buffers
from .dynamic_configs import DynamicConfigs
from . import features
from .interbroker import InterBrokerClient
from .metadata_cache import BrokerInfo, MetadataCache
from .network import Connection
from .replica_manager import ReplicaManager
from .steps import load_producer_state_soon

if TYPE_CHECKING:
    from .cluster_node import ClusterNode

log = logging.getLogger("ottla.broker")
# Connections closed at shutdown per loop iteration (see acceptor.py for why in slices).
_CLOSE_SLICE = 256

# A cluster broker that has not heard from a controller by then says so (it keeps waiting).
READY_NOTICE_S = 5.0


def _lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on the data dir for the broker's lifetime, as Kafka's `.lock`
    does: two brokers appending to the same segment files would corrupt them."""
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(f"data directory {data_dir} is in use by another broker") from None
    return fd


def _load_or_create_cluster_id(data_dir: Path, node_id: int, membership: ClusterMembership | None) -> str:
    """Kafka keeps the cluster id in meta.properties; a data dir belongs to one cluster.

    In a cluster the id comes from ZooKeeper's `/cluster/id` (the first broker proposes its
    own); a data dir of another cluster is refused, as Kafka's InconsistentClusterIdException.
    """
    meta = data_dir / "meta.properties"
    stored = None
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                stored = line.split("=", 1)[1].strip()
    proposed = stored or uuid.uuid4().hex[:22]
    cluster_id = membership.cluster_id(proposed) if membership is not None else proposed
    if stored is not None:
        if stored != cluster_id:
            raise StoreError(f"The Cluster ID {cluster_id} doesn't match stored clusterId {stored} in "
                             f"{meta}. The broker is trying to join the wrong cluster. Configured "
                             f"zookeeper.connect may be wrong.")
        return stored
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(f"version=1\ncluster.id={cluster_id}\nnode.id={node_id}\n")
    os.replace(tmp, meta)
    return cluster_id


def _runner_on(loop: asyncio.AbstractEventLoop):
    """For the log cleaner's threads: run a function on the event loop thread and wait for it."""

    def run(function):
        future: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:
                    future.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return future.result()

    return run


class Broker:
    def __init__(
        self,
        data_dir: str | Path,
        config: BrokerConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        advertised: tuple[str, int] | None = None,
        node_id: int | None = None,
        membership: ClusterMembership | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_data_dir(self.data_dir)
        self.config = config
        self.node_id = config["node.id"] if node_id is None else node_id
        self.host = host
        self.port = port
        self._advertised = advertised
        self._topic_changes = asyncio.Lock()  # single node: creations and growths one at a time
        self.membership = membership  # None: a single node without ZooKeeper
        self.cluster_id = _load_or_create_cluster_id(self.data_dir, self.node_id, membership)
        self.handlers = load_handlers()
        self.supported_versions = features.supported_versions(self.handlers, config)
        # ApiVersions' finalized features epoch: the levels come from the config, so they can
        # only change across a restart, and each start is a later epoch.
        self.features_epoch = now_ms()
        self.connections = Connections(config)
        self.logs = LogManager(self.data_dir, config, disk_worker=DiskWorker())
        self.cleaner = LogCleaner(self.logs, config, clock=now_ms, failpoints=failpoints_from_environment(),
                                  load_in_steps=load_producer_state_soon)
        self.metadata = MetadataCache(self.node_id, self.cluster_id)
        self.replicas = ReplicaManager(self.node_id, self.logs, self.metadata)
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self._publish_local_metadata()
        # In a cluster: this broker's controller candidacy and its side of the controller
        # protocol; None on a single node, which is its own controller.
        self.controller_service = None
        self.controller_link = None
        # Dynamic broker configs (KIP-226) and, in a cluster, topic config changes from the store.
        self.dynamic_configs = DynamicConfigs(self)
        self.authorizer = AllowAllAuthorizer()
        id_blocks = (membership.producer_id_blocks() if membership is not None
                     else FileProducerIdBlockStore(self.data_dir / "producer-id-block"))
        self.producer_ids = ProducerIdManager(id_blocks, self.node_id)
        self.interbroker = InterBrokerClient(f"broker-{self.node_id}")
        self.coordinator_runtime = BrokerCoordinatorRuntime(self)
        self.groups = GroupService(self.coordinator_runtime, config, now_ms)
        self.cluster: ClusterNode | None = None
        self._stopping = False
        self.transactions = TransactionService(self.coordinator_runtime, BrokerMarkerChannel(self, self.interbroker), config,
                                               self.producer_ids.generate_producer_id, now_ms)
        self._server: Acceptor | None = None
        self._duties: list[asyncio.Task] = []
        self._stopped = asyncio.Event()

    @property
    def advertised(self) -> tuple[str, int]:
        return self._advertised or (self.host, self.port)

    # lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.groups.start()
        await self.transactions.start()
        try:
            listening = await bind(self.host, self.port)
            size_socket_buffers(listening, self.config)
            self._server = Acceptor(listening, lambda: Connection(self))
            if self.membership is None:
                self._server.start()
        except OSError:
            await self.stop()  # a broker that never served still shuts down cleanly
            raise
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
            self._publish_local_metadata()  # the advertised port is known only now
        if self.membership is not None:
            from .cluster_node import ClusterNode  # the controller and replication: cluster brokers only

            cluster = ClusterNode(self)
            cluster.attach()
            try:
                # Bound but not listening until registered (Kafka processes no request before
                # registering): a broker restarted after kill -9 waits up to a session timeout
                # for its old registration, and the controller's requests meant for that old
                # incarnation (its broker epoch unknown here until registered) were applied.
                await self.membership.start(*self.advertised)
            except StoreError:
                await cluster.stop(registered=False)
                await self.stop()  # e.g. broker.id in use: stop serving, end the session
                raise
            self._server.start()
            self.cluster = cluster
            await self.cluster.start()
            # Once registered, the controller's requests may arrive at any await: logs created
            # meanwhile take the dynamic configs read on the next line.
            await self.dynamic_configs.start()
        self._duties.append(loop.create_task(self._periodic_flush()))
        self._duties.append(loop.create_task(self.connections.expire_idle()))
        self._duties.append(loop.create_task(release_after_connection_storms(self.connections)))
        self.cleaner.start(_runner_on(loop))
        log.info("broker %d listening on %s:%d (advertised %s:%d), data in %s",
                 self.node_id, self.host, self.port, *self.advertised, self.data_dir)

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, drop connections, flush and checkpoint the logs."""
        if self._stopping:
            return  # a second SIGTERM while stopping
        self._stopping = True
        if self.cluster is not None:
            # Still serving: the controller moves leadership away (controlled shutdown). A
            # failure there must not leave the broker running (Kafka swallows it too).
            try:
                await self.cluster.stop()
            except Exception:
                log.exception("broker %d: stopping its cluster roles failed; stopping anyway", self.node_id)
        if self._server is not None:
            self._server.close()
        for task in self._duties:
            task.cancel()
        self.dynamic_configs.stop()
        self.transactions.stop()
        self.groups.stop()
        self.replicas.close()
        await self.interbroker.close()
        for closed, connection in enumerate(list(self.connections), 1):
            connection.close()
            if closed % _CLOSE_SLICE == 0:
                await asyncio.sleep(0)  # thousands of connections: their ends run in between
        await asyncio.to_thread(self.cleaner.stop)  # the loop keeps serving a cleaner mid-commit
        self.logs.close()
        if self.membership is not None:
            self.membership.close()
        self.release_data_dir()
        self._stopped.set()
        log.info("broker %d stopped cleanly", self.node_id)

    def release_data_dir(self) -> None:
        """Drop the data-dir lock (the OS does the same when the process dies)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def ready(self) -> bool:
        """Wait until clients can use this broker; False if it stopped first. A cluster broker
        is ready once the controller told it the cluster (its first UpdateMetadata): until
        then it knows itself alone and no controller, and a client bootstrapping from it
        waits for a controller it cannot find (librdkafka's admin client does not ask again)."""
        if self.cluster is None:
            return not self._stopped.is_set()
        received = asyncio.ensure_future(self.cluster.link.metadata_received.wait())
        stopped = asyncio.ensure_future(self._stopped.wait())
        done, _ = await asyncio.wait({received, stopped}, timeout=READY_NOTICE_S, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            log.info("broker %d waits for the controller's first UpdateMetadata", self.node_id)
            await asyncio.wait({received, stopped}, return_when=asyncio.FIRST_COMPLETED)
        received.cancel()
        stopped.cancel()
        return not self._stopped.is_set()

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT stop the broker cleanly (with a controlled shutdown in a cluster)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: loop.create_task(self.stop()))

    async def serve_forever(self) -> None:
        self.stop_on_signals()
        if self._server is None:
            await self.start()
        await self._stopped.wait()

    async def _periodic_flush(self) -> None:
        """Time-based duties of the log layer (flush.ms, checkpoints, retention, producer expiry).

        A failing round is logged and the next one runs anyway, as Kafka's scheduler does:
        one bad partition must not stop flushes and checkpoints for all the others.
        """
        while True:
            await asyncio.sleep(1.0)
            try:
                self.logs.tick(now_ms())
            except Exception:
                log.exception("periodic log duties failed; retrying in a second")

    # the local controller ----------------------------------------------------------
    def _publish_local_metadata(self) -> None:
        """Single node: the local catalog is the cluster's metadata, and this broker leads every
        partition at leader epoch 0 (ISR = itself). In a cluster only the controller's
        UpdateMetadata and LeaderAndIsr give topics and roles; until the first one arrives
        the cache knows this broker alone."""
        host, port = self.advertised
        if self.membership is not None:
            if self.metadata.controller_epoch < 0:
                itself = BrokerInfo(self.node_id, host, port, self.config["broker.rack"])
                self.metadata.update(controller_id=-1, controller_epoch=-1, brokers=[itself],
                                     partition_states=[], topic_ids={})
            return
        deleted = self.metadata.local_update(BrokerInfo(self.node_id, host, port, self.config["broker.rack"]),
                                             [(t.name, t.topic_id, t.partitions) for t in self.logs.topics.values()])
        self.replicas.remove_partitions([key for key in self.replicas.partitions if key[0] in deleted])
        self.replicas.apply_partition_states(
            state for name in self.metadata.topic_names() for state in self.metadata.topic(name).partitions.values())

    def _publish_local_topic(self, info: TopicInfo) -> None:
        """Single node: one topic's partitions, led here at epoch 0 (`_publish_local_metadata`
        for one topic: the cost of a creation does not grow with the topics that exist)."""
        self.replicas.apply_partition_states(self.metadata.local_put(info.name, info.topic_id, info.partitions))

    def create_topic(self, name: str, partitions: int, configs: dict) -> TopicInfo:
        """Single node, inline (the internal topics at start): a cluster creates topics through
        the store (`cluster_admin`); requests use `create_topic_in_worker`."""
        info = self.logs.create_topic(name, partitions, configs)
        self._publish_local_topic(info)
        return info

    async def create_topic_in_worker(self, name: str, partitions: int, configs: dict) -> TopicInfo:
        """Single node: the directories of up to 10,000 partitions (seconds of disk work) are
        made in a worker thread while the loop serves others; one change to the catalog at a
        time, so a second creation of the name waits and gets TOPIC_ALREADY_EXISTS."""
        async with self._topic_changes:
            info = self.logs.create_topic(name, partitions, configs, validate_only=True)
            self.logs.add_created_topic(info, await asyncio.to_thread(self.logs.write_topic_files, info))
            self._publish_local_topic(info)
            return info

    def add_partitions(self, name: str, total: int) -> TopicInfo:
        info = self.logs.add_partitions(name, total)
        self._publish_local_topic(info)
        return info

    async def add_partitions_in_worker(self, name: str, total: int) -> TopicInfo:
        """Single node: as `create_topic_in_worker`, the new directories in a worker thread."""
        async with self._topic_changes:
            before = self.logs.topics.get(name)
            info = self.logs.add_partitions(name, total, validate_only=True)
            new_logs = await asyncio.to_thread(self.logs.write_partition_dirs, before, info)
            self.logs.add_created_partitions(info, new_logs)
            self._publish_local_topic(self.logs.topics[name])
            return info

    def delete_topic(self, name: str) -> None:
        partitions = self.logs.topics[name].partitions
        self.replicas.remove_partitions([(name, p) for p in range(partitions)])
        self.logs.delete_topic(name)
        self.metadata.local_remove(name)
