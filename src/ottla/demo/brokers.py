"""Where the demo's topics live, and the broker crash it inflicts mid-run.

`SingleNode` (the default, `make demo`): one broker without ZooKeeper; the crash is kill -9 of that
broker and an immediate restart on the same port, so the pipeline stalls until it is back.

`ReplicatedCluster` (`--brokers N`, N >= 3): ZooKeeper and N brokers (`ottla.testing.cluster`), topics
with replication factor 3 and `min.insync.replicas=2`; the crash is kill -9 of the leader of an input
partition. The pipeline carries on once the controller has moved leadership to the ISR (after the dead
broker's ZooKeeper session expires); the broker is restarted later, catches up as a follower and
rejoins the ISR before the output is verified.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable

from confluent_kafka.admin import AdminClient

from ..testing import BrokerProcess, cluster

Say = Callable[[str], None]
WAIT_S = 120.0  # for leaders to move and replicas to catch up on a busy machine


class SingleNode:
    replication = 1
    topic_config: dict[str, str] = {}

    def __init__(self, root: Path):
        self.broker = BrokerProcess(root / "broker")
        self.kills: list[str] = []
        self.restart_pending = False  # the crash restarts the broker at once

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def start(self, say: Say) -> None:
        self.broker.start()
        say(f"broker up at {self.bootstrap}, pid {self.broker.pid}, data in {self.broker.data_dir}")

    def crash(self, say: Say, running: str, topics: list[str]) -> None:
        pid = self.broker.pid
        self.broker.kill()
        self.kills.append("the broker")
        say(f">>> kill -9 the broker (pid {pid}) while {running} running")
        time.sleep(1.0)
        started = time.monotonic()
        self.broker.start()
        say(f"    broker restarted on {self.bootstrap} (pid {self.broker.pid}) in "
            f"{time.monotonic() - started:.1f}s: log recovered, transactions and groups reloaded")

    def restart(self, say: Say) -> None:
        """Nothing to do: `crash` already restarted the broker."""

    def settle(self, say: Say, topics: list[str]) -> None:
        """Nothing to wait for: a single replica is always in sync."""

    def describe(self) -> str:
        return "1 broker, no ZooKeeper, replication factor 1"

    def stop(self) -> None:
        self.broker.stop()


class ReplicatedCluster:
    replication = 3
    topic_config = {"min.insync.replicas": "2"}

    def __init__(self, root: Path, brokers: int):
        self.root = root
        self.size = brokers
        self.kills: list[str] = []
        self.restart_pending = False
        self._stack = contextlib.ExitStack()
        self._down: int | None = None

    def start(self, say: Say) -> None:
        self.cluster = self._stack.enter_context(cluster(self.size, root=self.root / "cluster", log_level="warning"))
        # Restarted brokers come back on their ports: every address stays a valid bootstrap server.
        self.bootstrap = ",".join(b.bootstrap for b in self.cluster.brokers.values())
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        brokers = ", ".join(f"{i} at {b.bootstrap} (pid {b.pid})" for i, b in self.cluster.brokers.items())
        say(f"ZooKeeper at {self.cluster.connect}; brokers {brokers}; data in {self.cluster.root}")
        say(f"controller: broker {self._controller()}; zookeeper.session.timeout.ms="
            f"{self.cluster.session_timeout_ms}")

    def _controller(self) -> int:
        return self.admin.describe_cluster(request_timeout=30).result(60).controller.id

    def _leaders(self, topics: list[str]) -> dict[tuple[str, int], tuple[int, list[int], list[int]]]:
        """(topic, partition) -> (leader, replicas, isr), from a Metadata request."""
        metadata = self.admin.list_topics(timeout=30).topics
        return {(t, p.id): (p.leader, list(p.replicas), list(p.isrs))
                for t in topics if t in metadata for p in metadata[t].partitions.values()}

    def crash(self, say: Say, running: str, topics: list[str]) -> None:
        """kill -9 the leader of the input's partition 0; returns once every partition it led has a new leader."""
        before = self._leaders(topics)
        victim = before[(topics[0], 0)][0]
        led = [tp for tp, (leader, _, _) in before.items() if leader == victim]
        controller = self._controller()
        handle = self.cluster.brokers[victim]
        pid = handle.pid
        killed_at = time.monotonic()
        handle.kill()
        self._down = victim
        self.restart_pending = True
        self.kills.append(f"broker {victim}" + (", the controller" if victim == controller else ""))
        role = " and the controller" if victim == controller else ""
        say(f">>> kill -9 broker {victim} (pid {pid}), leader of {_names(led)}{role}, while {running} running")
        say(f"    waiting for its ZooKeeper session to expire ({self.cluster.session_timeout_ms} ms) and the "
            f"controller to elect new leaders from the ISR (min.insync.replicas=2 of 3 still holds)")
        self._wait_moved(say, topics, victim, led, killed_at)

    def _wait_moved(self, say: Say, topics: list[str], victim: int, led: list, killed_at: float) -> None:
        deadline = killed_at + WAIT_S
        while True:
            try:
                now = self._leaders(topics)
                moved = {tp: now[tp][0] for tp in led if now[tp][0] not in (-1, victim)}
            except Exception:  # a Metadata request can time out while brokers reshuffle: ask again
                moved = {}
            if len(moved) == len(led):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"leaders of {_names(led)} did not move off broker {victim} in {WAIT_S:.0f}s")
            time.sleep(0.2)
        summary = ", ".join(f"{t}-{p} -> broker {moved[(t, p)]} (ISR {now[(t, p)][2]})" for t, p in led)
        say(f"    new leaders {time.monotonic() - killed_at:.1f}s after the kill: {summary}; "
            f"the pipeline runs on {self.size - 1} brokers")
        controller = self._controller()
        if controller != victim:
            say(f"    controller: broker {controller}")

    def restart(self, say: Say) -> None:
        """Start the killed broker again on its port and data: it recovers its log and fetches what it missed."""
        handle = self.cluster.brokers[self._down]
        started = time.monotonic()
        handle.start()
        self.restart_pending = False
        say(f"    broker {self._down} restarted (pid {handle.pid}) in {time.monotonic() - started:.1f}s: log "
            f"recovered, now a follower catching up from the leaders")

    def settle(self, say: Say, topics: list[str]) -> None:
        """Wait until every replica is back in the ISR, so the verifier reads a fully replicated cluster."""
        started = time.monotonic()
        while True:
            try:
                lagging = [tp for tp, (_, replicas, isr) in self._leaders(topics).items()
                           if sorted(isr) != sorted(replicas)]
            except Exception:
                lagging = ["(metadata)"]
            if not lagging:
                break
            if time.monotonic() - started > WAIT_S:
                raise TimeoutError(f"{_names(lagging)} still under-replicated after {WAIT_S:.0f}s")
            time.sleep(0.5)
        if self._down is not None:
            say(f"every partition of {', '.join(topics)} has its 3 replicas in the ISR again "
                f"(broker {self._down} caught up)")

    def describe(self) -> str:
        return f"{self.size} brokers and ZooKeeper, replication factor 3, min.insync.replicas=2"

    def stop(self) -> None:
        self._stack.close()


def _names(partitions: list) -> str:
    return ", ".join(tp if isinstance(tp, str) else f"{tp[0]}-{tp[1]}" for tp in partitions) or "nothing"


def deployment(brokers: int, root: Path) -> SingleNode | ReplicatedCluster:
    return SingleNode(root) if brokers == 1 else ReplicatedCluster(root, brokers)
