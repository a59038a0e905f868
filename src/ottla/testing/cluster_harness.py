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
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Mapping

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
        handles = [self.add_broker(start=False) for _ in range(brokers)]
        with ThreadPoolExecutor(max_workers=len(handles) or 1) as pool:
            for future in [pool.submit(h.start) for h in handles]:
                future.result()
        return self

    def stop(self) -> None:
        for handle in self.brokers.values():
            try:
                handle.stop()
            except RuntimeError:
                handle.kill()


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
