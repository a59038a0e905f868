"""A real cluster on loopback: one ZooKeeper and N `ottla serve` processes joined to it.

    with ottla.testing.cluster(brokers=3) as c:
        Producer({"bootstrap.servers": c.bootstrap})
        c.brokers[2].kill(); c.brokers[2].start()     # kill -9, then back on the same port
        c.brokers[3].pause()                           # SIGSTOP (resume() sends SIGCONT)

Broker ids are 1..N. Sessions time out after 6 s (Kafka: 18 s) so expiry tests stay short,
and a controlled shutdown that cannot move everything (the last broker of a cluster being
torn down) retries 0.5 s apart (Kafka: 5 s) so teardown stays short.
Brokers log at info level into their `stderr_path` files (never to the console): a failing
test's report shows their last lines.
`zookeeper_nodes=3` puts the brokers on a 3-node ensemble (`c.zookeeper.leader().kill()`).
A cluster shared by a module's tests is `restore()`d before each test, so one that failed
midway (a broker left killed, stopped or paused) does not fail every later test.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..admin_client import AdminProtocolClient, ProtocolClientError
from .broker import BrokerProcess
from .zookeeper import ZooKeeperEnsemble, ZooKeeperServer, zookeeper, zookeeper_ensemble

TEST_SESSION_TIMEOUT_MS = 6000
TEST_CONTROLLED_SHUTDOWN_BACKOFF_MS = 500
START_TIMEOUT_S = 120.0  # generous: the machine running the tests may be busy


class Cluster:
    def __init__(self, root: Path, zk: ZooKeeperServer | ZooKeeperEnsemble, *, config: Mapping[str, object] | None = None,
                 session_timeout_ms: int = TEST_SESSION_TIMEOUT_MS, log_level: str = "info"):
        self.root = Path(root)
        self.zookeeper = zk
        self.config = dict(config or {})
        self.session_timeout_ms = session_timeout_ms
        self.log_level = log_level
        self.brokers: dict[int, BrokerProcess] = {}
        self._zk_client: KazooClient | None = None  # restore()'s, kept between tests

    @property
    def connect(self) -> str:
        """The brokers' `zookeeper.connect`."""
        return self.zookeeper.connect

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.running())

    def add_broker(self, broker_id: int | None = None, *, config: Mapping[str, object] | None = None,
                   start: bool = True) -> BrokerProcess:
        broker_id = broker_id if broker_id is not None else max(self.brokers, default=0) + 1
        settings = {"zookeeper.connect": self.connect, "broker.id": broker_id,
                    "zookeeper.session.timeout.ms": self.session_timeout_ms,
                    "controlled.shutdown.retry.backoff.ms": TEST_CONTROLLED_SHUTDOWN_BACKOFF_MS,
                    **self.config, **(config or {})}
        # A broker restarted after kill -9 waits up to a session timeout for its old registration.
        handle = BrokerProcess(self.root / f"broker-{broker_id}", settings, log_level=self.log_level,
                               start_timeout=START_TIMEOUT_S)
        self.brokers[broker_id] = handle
        return handle.start() if start else handle

    def start(self, brokers: int) -> "Cluster":
        _start_all([self.add_broker(start=False) for _ in range(brokers)])
        return self

    def restore(self, timeout: float = START_TIMEOUT_S) -> "Cluster":
        """Every ZooKeeper server and broker running again (paused ones resumed, dead ones
        restarted on their port and data), then wait until ZooKeeper has every broker
        registered and every broker's Metadata agrees with it and with the others: all
        brokers, the controller, every partition led and in sync on every broker. When nothing
        changed this costs one ZooKeeper read and one Metadata request per broker."""
        for server in getattr(self.zookeeper, "servers", [self.zookeeper]):
            if not server.running():
                server.start()
            server.resume()
        for handle in self.brokers.values():
            if handle.running():
                handle.resume()  # SIGCONT does nothing to a process that is not stopped
        _start_all([handle for handle in self.brokers.values() if not handle.running()])
        deadline = time.monotonic() + timeout
        while (divergence := self._divergence()) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not restored in {timeout}s: {divergence}")
            time.sleep(0.1)
        return self

    def _divergence(self) -> str | None:
        """What keeps the cluster from being whole and agreed, or None."""
        if self._zk_client is None:
            self._zk_client = KazooClient(hosts=self.connect)
            self._zk_client.start(timeout=30)
        expected = sorted(self.brokers)
        try:
            registered = sorted(int(i) for i in self._zk_client.get_children("/brokers/ids"))
            controller = json.loads(self._zk_client.get("/controller")[0])["brokerid"]
        except NoNodeError:
            return "no controller"
        if registered != expected:
            return f"brokers {registered} registered, expected {expected}"
        views = {}
        for broker_id, handle in self.brokers.items():
            try:
                with AdminProtocolClient(handle.bootstrap, timeout=10, client_id="ottla-restore") as client:
                    response = client.metadata_response(None)
            except (ProtocolClientError, OSError) as exc:
                return f"broker {broker_id}: {exc}"
            views[broker_id] = view = (
                response.controller_id, sorted(b.node_id for b in response.brokers),
                sorted((t.name, p.partition_index, p.leader_id, p.leader_epoch, sorted(p.replica_nodes),
                        sorted(p.isr_nodes), sorted(p.offline_replicas)) for t in response.topics for p in t.partitions))
            if view[:2] != (controller, expected):
                return f"broker {broker_id} names controller {view[0]} and brokers {view[1]}"
            # Replicas on brokers the cluster never had (an assignment naming broker 9) stay out.
            lagging = [p for p in view[2] if p[2] < 0 or set(p[4]) & set(expected) - set(p[5])]
            if lagging:
                return f"broker {broker_id}: partitions not led or not in sync {lagging[:5]}"
        if len({repr(view) for view in views.values()}) > 1:
            return f"brokers' metadata differ: {views}"
        return None

    def stop(self) -> None:
        if self._zk_client is not None:
            self._zk_client.stop()
            self._zk_client.close()
            self._zk_client = None
        for handle in self.brokers.values():
            try:
                handle.stop()
            except RuntimeError:
                handle.kill()


def _start_all(handles: list[BrokerProcess]) -> None:
    """Start brokers together: each restarted after kill -9 may wait out its old session."""
    with ThreadPoolExecutor(max_workers=len(handles) or 1) as pool:
        for future in [pool.submit(h.start) for h in handles]:
            future.result()


@contextlib.contextmanager
def cluster(brokers: int = 3, config: Mapping[str, object] | None = None, *,
            session_timeout_ms: int = TEST_SESSION_TIMEOUT_MS, zookeeper_nodes: int = 1,
            root: str | Path | None = None, log_level: str = "info") -> Iterator[Cluster]:
    """ZooKeeper and `brokers` brokers for the duration of the block; all cleaned up after."""
    owned = root is None
    base = Path(tempfile.mkdtemp(prefix="ottla-cluster-")) if owned else Path(root)
    servers = (zookeeper(root=base / "zookeeper") if zookeeper_nodes == 1
               else zookeeper_ensemble(zookeeper_nodes, root=base / "zookeeper"))
    try:
        with servers as zk:
            handle = Cluster(base, zk, config=config, session_timeout_ms=session_timeout_ms, log_level=log_level)
            try:
                yield handle.start(brokers)
            finally:
                handle.stop()
    finally:
        if owned:
            shutil.rmtree(base, ignore_errors=True)
