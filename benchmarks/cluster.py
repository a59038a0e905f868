"""Controller failover and the metadata path on three brokers (`ottla.testing.cluster`, a real ZooKeeper).

1. Metadata latency: Metadata v12 for all topics, p50/p99, first with one 1-partition topic (the
   baseline), then with a topic of `--partitions` partitions (replication factor 3) added. Two
   clients: raw requests with Ottla's own codec over one socket per broker (the time from sending
   the frame to having the whole response frame, requests round-robin over the three brokers), and
   confluent-kafka's `AdminClient.list_topics()` (librdkafka's request plus its parsing into Python).
2. Controller failover: kill -9 of the controller. A kazoo client watches ZooKeeper; times from the
   kill to: the dead broker's `/brokers/ids/<id>` gone (its session expired), `/controller` taken by
   another broker, the new controller id in a survivor's Metadata response, and every partition the
   dead broker led shown with a new leader (polled every 20 ms). Then the broker is restarted: the
   time until it serves, and from then until every replica is back in the ISR. Repeated `--rounds` times; before each round a
   preferred leader election spreads leadership again.

With `--log-level info` the brokers log each request step that held the event loop 100 ms of
CPU or more, and their longest step per API when they stop; the benchmark then prints the
longest step per API over all brokers (LeaderAndIsr and UpdateMetadata: what creating the topic
and each failover's role changes cost every other client of that broker).

    PYTHONPATH=src python benchmarks/cluster.py [--partitions 1000] [--samples 300] [--rounds 3] [--log-level info]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kio.schema.metadata.v12.request import MetadataRequest

from ottla.protocol.codec import decode_response, encode_request
from ottla.testing import cluster

METADATA_KEY, METADATA_VERSION = 3, 12
POLL_S = 0.02
WAIT_S = 300.0


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class RawClient:
    """One connection to one broker; Metadata for all topics, encoded and decoded with Ottla's codec."""

    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0

    def metadata(self):
        """(seconds from send to the whole response frame, response bytes, decoded response)."""
        self.correlation += 1
        frame = encode_request(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False),
                               self.correlation, "ottla-bench")
        started = time.perf_counter()
        self.sock.sendall(frame)
        body = self._read(struct.unpack(">i", self._read(4))[0])
        elapsed = time.perf_counter() - started
        return elapsed, len(body), decode_response(body, METADATA_KEY, METADATA_VERSION)[1]

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000


def metadata_latency(handle, samples: int) -> dict[str, tuple[float, float, int]]:
    """name -> (p50 ms, p99 ms, response bytes). The two clients take turns, request by request, so
    both see the same load on a shared machine."""
    clients = [RawClient(b.bootstrap) for b in handle.brokers.values()]
    admin = AdminClient({"bootstrap.servers": handle.bootstrap, "log_level": 0})
    for client in clients:  # warm up: connections, and the broker's first look at this request
        client.metadata()
    admin.list_topics(timeout=30)
    raw, confluent, size = [], [], 0
    for i in range(samples):
        elapsed, size, _ = clients[i % len(clients)].metadata()
        raw.append(elapsed)
        started = time.perf_counter()
        admin.list_topics(timeout=30)
        confluent.append(time.perf_counter() - started)
    for client in clients:
        client.close()
    return {"raw": (*percentiles(raw), size), "confluent": (*percentiles(confluent), size)}


def leaders(response, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr) of one topic in a Metadata response."""
    for t in response.topics:
        if t.name == topic:
            return {p.partition_index: (p.leader_id, list(p.replica_nodes), list(p.isr_nodes)) for p in t.partitions}
    return {}


def wait_in_sync(address: str, topic: str, partitions: int) -> float | None:
    """Seconds until every partition of `topic` has a leader and its full replica set in the ISR
    (None if that takes more than WAIT_S)."""
    started = time.monotonic()
    client = RawClient(address)
    try:
        while True:
            state = leaders(client.metadata()[2], topic)
            if len(state) == partitions and all(leader >= 0 and sorted(isr) == sorted(replicas)
                                                for leader, replicas, isr in state.values()):
                return time.monotonic() - started
            if time.monotonic() - started > WAIT_S:
                return None
            time.sleep(0.2)
    finally:
        client.close()


class Watch:
    """Timestamps of ZooKeeper changes, taken in kazoo's event thread as the watches fire."""

    def __init__(self, zk: KazooClient):
        self.lock = threading.Lock()
        self.controllers: list[tuple[float, int | None]] = []
        self.brokers: list[tuple[float, set[int]]] = []
        zk.DataWatch("/controller", self._controller)
        zk.ChildrenWatch("/brokers/ids", self._brokers)

    def _controller(self, data, stat) -> None:
        with self.lock:
            self.controllers.append((time.monotonic(), json.loads(data)["brokerid"] if data else None))

    def _brokers(self, children) -> None:
        with self.lock:
            self.brokers.append((time.monotonic(), {int(c) for c in children}))

    def first(self, events: list, after: float, test) -> float | None:
        with self.lock:
            return next((t - after for t, value in events if t >= after and test(value)), None)


def failover_round(handle, zk: KazooClient, watch: Watch, topic: str, partitions: int) -> dict[str, float]:
    victim = json.loads(zk.get("/controller")[0])["brokerid"]
    survivor = next(b for b in handle.brokers if b != victim)
    client = RawClient(handle.brokers[survivor].bootstrap)
    led = [p for p, (leader, _, _) in leaders(client.metadata()[2], topic).items() if leader == victim]
    progress(f"kill -9 controller broker {victim}, leader of {len(led)} of {partitions} partitions")
    killed_at = time.monotonic()
    handle.brokers[victim].kill()
    seen_controller = moved = None
    while moved is None or seen_controller is None:
        response = client.metadata()[2]
        now = time.monotonic() - killed_at
        if seen_controller is None and response.controller_id not in (-1, victim):
            seen_controller = now
        state = leaders(response, topic)
        if moved is None and all(state[p][0] not in (-1, victim) for p in led):
            moved = now
        if now > WAIT_S:
            raise TimeoutError(f"no new controller, or leaders still on broker {victim}, after {WAIT_S:.0f}s")
        time.sleep(POLL_S)
    client.close()
    result = {"led": len(led), "expired": watch.first(watch.brokers, killed_at, lambda ids: victim not in ids),
              "controller": watch.first(watch.controllers, killed_at, lambda b: b not in (None, victim)),
              "metadata_controller": seen_controller, "moved": moved}
    progress(f"broker {victim} gone from /brokers/ids after {result['expired']:.2f}s, new controller after "
             f"{result['controller']:.2f}s, leaders moved after {moved:.2f}s; restarting it")
    restarted = time.monotonic()
    handle.brokers[victim].start()
    result["serving"] = time.monotonic() - restarted
    result["in_sync"] = wait_in_sync(handle.brokers[survivor].bootstrap, topic, partitions)
    progress(f"broker {victim} serving {result['serving']:.1f}s after its restart, back in the ISR of every "
             f"partition {result['in_sync']:.1f}s later"
             if result["in_sync"] is not None else f"broker {victim} not back in every ISR after {WAIT_S:.0f}s")
    return result


def elect_preferred(handle, topic: str, partitions: int) -> None:
    """Give leadership back to each partition's first replica (ElectLeaders), and wait until every
    broker's Metadata shows it, so each round starts balanced."""
    admin = AdminClient({"bootstrap.servers": handle.bootstrap, "log_level": 0})
    admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, p) for p in range(partitions)]).result(120)
    clients = [RawClient(b.bootstrap) for b in handle.brokers.values()]
    deadline = time.monotonic() + WAIT_S
    while True:
        states = [leaders(client.metadata()[2], topic) for client in clients]
        if all(leader == replicas[0] for state in states for leader, replicas, _ in state.values()):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"preferred leaders of {topic} not elected after {WAIT_S:.0f}s")
        time.sleep(0.2)
    for client in clients:
        client.close()


HELD = re.compile(r"(\w+ v\d+) held the event loop for (\d+) ms of CPU in one step")
STEPS = re.compile(r"longest single steps: (.*?); longest garbage")
STEP = re.compile(r"(\w+ v\d+) (\d+) ms")


def loop_holds(root: Path) -> dict[str, int]:
    """API -> its longest single step (ms of the loop thread's CPU) on any broker, from the
    brokers' logs at info level: the summary each logs when it stops, and the steps of 100 ms
    or more each logs as they happen (the only record a killed broker leaves)."""
    found: dict[str, int] = {}
    for path in sorted(root.glob("broker-*.stderr.log")):
        for line in path.read_text(errors="replace").splitlines():
            steps = STEPS.search(line)
            for what, ms in STEP.findall(steps.group(1)) if steps else HELD.findall(line):
                found[what] = max(found.get(what, 0), int(ms))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=300, help="Metadata requests per client and case")
    parser.add_argument("--rounds", type=int, default=3, help="controller kills")
    parser.add_argument("--log-level", default="warning", choices=["warning", "info"],
                        help="the brokers'; info also reports the steps that held their event loop")
    parser.add_argument("--keep", action="store_true", help="keep the brokers' data and logs (the path is printed)")
    args = parser.parse_args()
    load = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="ottla-bench-cluster-"))
    try:
        result = run(args, root)
        holds = loop_holds(root)
    finally:
        if args.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(args, load, *result, holds)


def run(args, root: Path):
    with cluster(brokers=3, log_level=args.log_level, root=root) as handle:
        session_ms = handle.session_timeout_ms
        progress(f"cluster up: {handle.bootstrap}, zookeeper.session.timeout.ms={session_ms}")
        admin = AdminClient({"bootstrap.servers": handle.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic("small", 1, 3)])["small"].result(60)
        wait_in_sync(handle.brokers[1].bootstrap, "small", 1)
        small = metadata_latency(handle, args.samples)
        progress(f"Metadata, 1 partition: {small}")
        admin.create_topics([NewTopic("big", args.partitions, 3)])["big"].result(120)
        created = time.monotonic()
        wait_in_sync(handle.brokers[1].bootstrap, "big", args.partitions)
        progress(f"{args.partitions} partitions in sync {time.monotonic() - created:.1f}s after CreateTopics")
        big = metadata_latency(handle, args.samples)
        progress(f"Metadata, {args.partitions + 1} partitions: {big}")

        zk = KazooClient(hosts=handle.connect)
        zk.start()
        try:
            watch = Watch(zk)
            rounds = []
            for _ in range(args.rounds):
                elect_preferred(handle, "big", args.partitions)
                rounds.append(failover_round(handle, zk, watch, "big", args.partitions))
                if rounds[-1]["in_sync"] is None:
                    break  # the next round would not start from a healthy cluster
        finally:
            zk.stop()
            zk.close()
    return session_ms, small, big, rounds


def report(args, load, session_ms, small, big, rounds, holds) -> None:
    after = os.getloadavg()
    print(f"\nload average (1, 5, 15 min): {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start, "
          f"{after[0]:.1f} {after[1]:.1f} {after[2]:.1f} at the end")
    print("\n| Metadata v12, all topics, 3 brokers | response | raw codec p50 / p99 | confluent list_topics p50 / p99 |")
    print("| --- | --- | --- | --- |")
    for name, result in (("1 topic, 1 partition (RF 3)", small),
                         (f"+ 1 topic, {args.partitions:,} partitions (RF 3)", big)):
        print(f"| {name} | {result['raw'][2]:,} B | {result['raw'][0]:.2f} / {result['raw'][1]:.2f} ms | "
              f"{result['confluent'][0]:.2f} / {result['confluent'][1]:.2f} ms |")
    print(f"\n| kill -9 of the controller (zookeeper.session.timeout.ms={session_ms}), seconds after the kill "
          f"| {' | '.join(f'round {i + 1}' for i in range(len(rounds)))} | median |")
    print("| --- |" + " --- |" * (len(rounds) + 1))
    for key, name in (("led", "partitions the controller led"),
                      ("expired", "its /brokers/ids znode gone (session expired)"),
                      ("controller", "new controller in /controller"),
                      ("metadata_controller", "new controller in a survivor's Metadata"),
                      ("moved", "all its partitions have new leaders (Metadata)"),
                      ("serving", "its restart (same port and data) until it serves"),
                      ("in_sync", "then until every replica is back in the ISR")):
        values = [r[key] for r in rounds]
        known = [v for v in values if v is not None]
        values.append(statistics.median(known) if len(known) == len(values) else None)
        print(f"| {name} | " + " | ".join(f"> {WAIT_S:.0f}" if v is None else f"{v:.0f}" if key == "led"
                                          else f"{v:.2f}" for v in values) + " |")
    if holds:
        print("\n| longest single step on any broker (ms of the event loop's CPU) | " +
              " | ".join(sorted(holds, key=lambda what: -holds[what])[:8]) + " |")
        print("| --- |" + " --- |" * min(len(holds), 8))
        print("| | " + " | ".join(str(ms) for ms in sorted(holds.values(), reverse=True)[:8]) + " |")

if __name__ == "__main__":
    main()
