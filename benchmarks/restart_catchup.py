"""The timeline of one restarted broker rejoining the ISR, on three brokers (`ottla.testing.cluster`,
a real ZooKeeper, replication factor 3, min.insync.replicas=2).

Each round kills one broker with kill -9 (by default one that is not the controller; `--victim
controller` kills the controller), waits until the controller has taken it out of every ISR,
produces `--backlog` records per partition while it is down, restarts it on the same port and data,
and times, from the process start, each step until every survivor's Metadata shows it back in every
ISR: registered (its log), the controller seeing it (the controller's log), LeaderAndIsr applied
(its first and last "following" line), the leaders deciding to expand the ISR ("Expanding ISR"),
the ISR written to ZooKeeper (the state znodes' mtime), `/isr_change_notification` children seen
(a kazoo watch) and the new ISR in both survivors' Metadata (polled every 50 ms). Per-partition
steps show first / median / last over the partitions. The backlog is produced with acks=1
(acks=all over hundreds of partitions is slow for reasons of its own); `--rate` keeps an
acks=all producer running through the restart (the follower then chases a moving log end).

    PYTHONPATH=src python benchmarks/restart_catchup.py [--partitions 100] [--backlog 1000] [--rate 0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from ottla.testing import cluster

TOPIC = "catchup"
WAIT_S = 300.0
LINE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def log_events(path: Path, since: float, pattern: re.Pattern) -> list[tuple[float, re.Match]]:
    """(wall time, match) of each line of a broker's log at or after `since` matching `pattern`."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        stamp = LINE_TIME.match(line)
        match = pattern.search(line)
        if stamp and match:
            at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since - 0.001:
                found.append((at, match))
    return found


def isr_states(zk: KazooClient, partitions: int) -> dict[int, tuple[list[int], float]]:
    """partition -> (ISR, mtime of its state znode, wall seconds)."""
    states = {}
    for p in range(partitions):
        data, stat = zk.get(f"/brokers/topics/{TOPIC}/partitions/{p}/state")
        states[p] = (json.loads(data)["isr"], stat.mtime / 1000)
    return states


def wait(what: str, test, timeout: float = WAIT_S, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout:.0f}s")
        time.sleep(every)


class MetadataWatch(threading.Thread):
    """Polls each survivor's Metadata; records, per broker and partition, when `victim` is first
    in the ISR."""

    def __init__(self, brokers: dict[int, str], victim: int, partitions: int):
        super().__init__(daemon=True)
        self.victim, self.partitions = victim, partitions
        self.admins = {b: AdminClient({"bootstrap.servers": address, "log_level": 0}) for b, address in brokers.items()}
        self.seen: dict[int, dict[int, float]] = {b: {} for b in brokers}
        self.stop_event = threading.Event()

    def complete(self) -> bool:
        return all(len(seen) == self.partitions for seen in self.seen.values())

    def run(self) -> None:
        while not self.stop_event.is_set() and not self.complete():
            for broker, admin in self.admins.items():
                try:
                    topic = admin.list_topics(TOPIC, timeout=5).topics.get(TOPIC)
                except Exception:
                    continue
                now = time.time()
                for p, info in (topic.partitions.items() if topic is not None else ()):
                    if self.victim in info.isrs:
                        self.seen[broker].setdefault(p, now)
            self.stop_event.wait(0.05)


class NotificationWatch:
    """When each /isr_change_notification child was first seen."""

    def __init__(self, zk: KazooClient):
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        zk.ensure_path("/isr_change_notification")
        zk.ChildrenWatch("/isr_change_notification", self._children)

    def _children(self, children) -> None:
        now = time.time()
        with self.lock:
            for child in children:
                self.seen.setdefault(child, now)

    def times(self, since: float) -> list[float]:
        with self.lock:
            return sorted(t for t in self.seen.values() if t >= since)


class SteadyProducer(threading.Thread):
    """acks=all records at `rate` per second, round-robin over the partitions, until stopped."""

    def __init__(self, bootstrap: str, partitions: int, rate: float):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 0})
        self.partitions, self.rate = partitions, rate
        self.stop_event = threading.Event()

    def run(self) -> None:
        sent, started = 0, time.monotonic()
        while not self.stop_event.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while sent < due:
                try:
                    self.producer.produce(TOPIC, b"x" * 100, partition=sent % self.partitions)
                    sent += 1
                except BufferError:
                    break
            self.producer.poll(0.01)
        self.producer.flush(60)


def produce_backlog(bootstrap: str, partitions: int, per_partition: int, size: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20,
                         "batch.size": 256 * 1024, "log_level": 0})
    value = b"x" * size
    for i in range(per_partition * partitions):
        while True:
            try:
                producer.produce(TOPIC, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0, "backlog not acknowledged"


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[0]:.2f} / {statistics.median(ordered):.2f} / {ordered[-1]:.2f}"


def one_round(handle, zk: KazooClient, notifications: NotificationWatch, args) -> dict[str, object]:
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    victim = controller if args.victim == "controller" else max(b for b in handle.brokers if b != controller)
    survivors = {b: h.bootstrap for b, h in handle.brokers.items() if b != victim}
    progress(f"kill -9 broker {victim} (controller: {controller})")
    handle.brokers[victim].kill()
    wait(f"broker {victim} still in an ISR",
         lambda: all(victim not in isr for isr, _ in isr_states(zk, args.partitions).values()), every=0.5)
    if args.backlog:
        produce_backlog(",".join(survivors.values()), args.partitions, args.backlog, args.size)
        progress(f"{args.backlog} records of {args.size} B per partition produced while it was down")
    producer = SteadyProducer(",".join(survivors.values()), args.partitions, args.rate) if args.rate else None
    if producer is not None:
        producer.start()
        time.sleep(1)
    metadata = MetadataWatch(survivors, victim, args.partitions)
    load = os.getloadavg()[0]
    started = time.time()
    handle.brokers[victim].start()
    ready = time.time()
    metadata.start()
    metadata.join(WAIT_S)
    metadata.stop_event.set()
    done = time.time()
    if producer is not None:
        producer.stop_event.set()
        producer.join(60)
    states = isr_states(zk, args.partitions)
    root = handle.root
    victim_log = root / f"broker-{victim}.stderr.log"
    leader_logs = [root / f"broker-{b}.stderr.log" for b in survivors]
    controller_now = json.loads(zk.get("/controller")[0])["brokerid"]
    registered = log_events(victim_log, started, re.compile(r"registered broker"))
    seen = log_events(root / f"broker-{controller_now}.stderr.log", started,
                      re.compile(rf"controller: brokers \[[^\]]*\b{victim}\b[^\]]*\] started"))
    following = log_events(victim_log, started, re.compile(rf"following {TOPIC}-(\d+) from"))
    expanding, written = {}, {}
    for path in leader_logs:
        for at, m in log_events(path, started, re.compile(rf"Expanding ISR of {TOPIC}-(\d+) from")):
            expanding.setdefault(int(m.group(1)), at)
        for at, m in log_events(path, started, re.compile(rf"ISR of {TOPIC}-(\d+) is now \[([\d, ]*)\]")):
            if str(victim) in m.group(2).split(", "):
                written.setdefault(int(m.group(1)), at)
    rel = lambda times: [t - started for t in times]  # noqa: E731
    in_zk = [mtime for isr, mtime in states.values() if victim in isr and mtime >= started]
    return {
        "victim": f"{victim}{' (controller)' if victim == controller else ''}", "load": load,
        "ready": ready - started,
        "registered": rel([t for t, _ in registered[:1]]),
        "controller saw it": rel([t for t, _ in seen[:1]]),
        "LeaderAndIsr applied (first / last following)": rel([t for t, _ in following]),
        "leader decides to expand": rel(list(expanding.values())),
        "ISR written (leader's log)": rel(list(written.values())),
        "ISR in ZooKeeper (state mtime)": rel(in_zk),
        "/isr_change_notification children seen": rel(notifications.times(started)),
        "in both survivors' Metadata": rel([max(metadata.seen[b].get(p, float("inf")) for b in survivors)
                                            for p in range(args.partitions)]),
        "complete": (done - started) if metadata.complete() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--backlog", type=int, default=1000, help="records per partition produced while it is down")
    parser.add_argument("--size", type=int, default=100, help="record value bytes")
    parser.add_argument("--rate", type=float, default=0, help="acks=all records/s produced during the restart")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--victim", choices=["follower", "controller"], default="follower")
    parser.add_argument("--config", action="append", default=[], help="broker config key=value")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    config = dict(item.split("=", 1) for item in args.config)
    root = Path(tempfile.mkdtemp(prefix="ottla-bench-catchup-"))
    loads = [os.getloadavg()]
    rounds = []
    try:
        with cluster(brokers=3, config=config, root=root) as handle:
            admin = AdminClient({"bootstrap.servers": handle.bootstrap, "log_level": 0})
            admin.create_topics([NewTopic(TOPIC, args.partitions, 3,
                                          config={"min.insync.replicas": "2"})])[TOPIC].result(60)
            zk = KazooClient(hosts=handle.connect)
            zk.start()
            try:
                wait("topic not in sync", lambda: all(
                    len(isr) == 3 for isr, _ in isr_states(zk, args.partitions).values()), every=0.5)
                notifications = NotificationWatch(zk)
                for _ in range(args.rounds):
                    rounds.append(one_round(handle, zk, notifications, args))
                    progress(f"round {len(rounds)}: {rounds[-1]['complete']}")
                    if rounds[-1]["complete"] is None:
                        break
            finally:
                zk.stop()
                zk.close()
    finally:
        loads.append(os.getloadavg())
        if args.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(args, loads, rounds)


def report(args, loads, rounds) -> None:
    print(f"\n{args.partitions} partitions RF 3, {args.backlog} x {args.size} B per partition produced while "
          f"down, {args.rate:g} records/s during the restart; load average (1 min) {loads[0][0]:.1f} at the start, "
          f"{loads[1][0]:.1f} at the end")
    print("\nseconds from the process start; per-partition steps: first / median / last\n")
    print("| step | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |")
    print("| --- |" + " --- |" * len(rounds))
    keys = [k for k in rounds[0] if k not in ("complete",)] + ["complete"]
    for key in keys:
        cells = []
        for r in rounds:
            value = r.get(key)
            if isinstance(value, list):
                cells.append(spread(value) + (f" ({len(value)})" if len(value) > 1 else ""))
            elif isinstance(value, float):
                cells.append(f"{value:.2f}")
            elif value is None:
                cells.append(f"> {WAIT_S:.0f}")
            else:
                cells.append(str(value))
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
