"""kill -9 of a partition leader, step by step: where the time to the next acknowledged produce goes.

Three brokers and one ZooKeeper (`ottla.testing.cluster`, `zookeeper.session.timeout.ms` 6 s
unless `--session-timeout-ms`), the brokers logging at debug level. A topic of three
partitions (RF=3, `min.insync.replicas=2`), partition p preferring broker p + 1. Producers
with default configs except acks=all and idempotence send to every partition at a steady
pace, each in a thread of its own:

- `rdkafka`: confluent-kafka (librdkafka), `debug=metadata` so its Metadata answers can be
  timed (logging only);
- `rdkafka-backoff100`: the same with `retry.backoff.max.ms=100` (a client setting, shown
  apart: what librdkafka's own backoff costs);
- `rdkafka-50`: default configs, but up to 50 records in flight per partition instead of 5
  (the pace of `test_replication.py`'s bounce test);
- `kafka-python`: its cluster metadata listener times the answers.

Each bounce: a preferred election (each broker leads one partition), kill -9 of one broker
(the controller every third bounce), the times after the kill of

  expiry     the first `/brokers/ids` (or `/controller`) watch event on a survivor: the dead
             broker's ZooKeeper session expired
  elected    the controller's log line for the partition's new leader (state znode written)
  LAI        the new leader applied the LeaderAndIsr naming it
  UM all     the last survivor applied the UpdateMetadata naming it
  client md  each client's first Metadata answer naming the new leader
  client ack each client's first acknowledgement of a record sent after the kill

then the broker is started again and the next bounce waits for every ISR to be full.

`--sigterms N` then SIGTERMs a leader N times (controlled shutdown; brokers 1, 2, 3 in turn,
each leading its partition after a preferred election): per client, the longest gap between
acknowledgements of that partition from the SIGTERM until a second after the broker exited,
and on the surviving followers the time from each LeaderAndIsr telling them to follow a
partition to its truncation (from then on fetched again). A round with a gap over
`--gap-threshold` prints every broker's log lines around the gap.

    PYTHONPATH=src python benchmarks/failover.py [--bounces 6] [--sigterms 0] [--session-timeout-ms 6000]
        [--client-trace PREFIX]  # the rdkafka and kafka-python clients' debug lines, timestamped
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import statistics
import sys
import threading
import time
from datetime import datetime

from confluent_kafka import ElectionType, KafkaException, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka import TopicPartition as KPTopicPartition

from ottla.testing import cluster

TOPIC = "bounced"
PARTITIONS = 3
CONFIG = {"replica.lag.time.max.ms": 10000}
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) level=\w+ logger=\S+ (.*)$")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Client:
    """A producer thread: records (partition, sent, acknowledged) and when each Metadata
    answer it took named which leader for each partition."""

    def __init__(self, name: str, window: int = 5):
        self.name = name
        self.window = window  # records in flight per partition at most
        self.acks: list[tuple[int, float, float]] = []
        self.leaders: list[tuple[float, int, int]] = []  # (time, partition, leader)
        self.errors: list[str] = []
        self.in_flight = [0] * PARTITIONS
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def acked(self, partition: int, sent: float, err) -> None:
        self.in_flight[partition] -= 1
        if err is None:
            self.acks.append((partition, sent, time.time()))
        else:
            self.errors.append(str(err))

    def longest_gap(self, partition: int, start: float, until: float) -> tuple[float, float]:
        """The longest time between two acknowledgements of `partition` within [start, until],
        and when it began."""
        times = [start] + sorted(a for p, _, a in self.acks if p == partition and start < a <= until) + [until]
        return max((b - a, a) for a, b in zip(times, times[1:]))

    def first_ack_after(self, partition: int, moment: float) -> float | None:
        return min((a for p, s, a in self.acks if p == partition and s > moment), default=None)

    def first_leader_after(self, partition: int, moment: float, dead: int) -> float | None:
        return min((t for t, p, leader in self.leaders if p == partition and t > moment and leader not in (-1, dead)),
                   default=None)


class RdKafka(Client):
    METADATA = re.compile(r"Topic (\S+) \[(\d+)\] Leader (-?\d+)")

    def __init__(self, name: str, bootstrap: str, extra: dict, window: int = 5, trace: str | None = None):
        super().__init__(name, window)
        logger = logging.getLogger(f"rdkafka.{name}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_Sink(self))
        if trace:  # every debug line, timestamped, for a step-by-step look at a round
            logger.addHandler(_file_handler(trace))
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "debug": "metadata,broker,topic,msg,protocol" if trace else "metadata",
                                  "logger": logger, **extra})

    def saw(self, message: str) -> None:
        for topic, partition, leader in self.METADATA.findall(message):
            if topic == TOPIC:
                self.leaders.append((time.time(), int(partition), int(leader)))

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in range(PARTITIONS):
                if self.in_flight[p] < self.window:
                    self.in_flight[p] += 1
                    self.producer.produce(TOPIC, b"x", partition=p,
                                          on_delivery=lambda err, _m, p=p, s=time.time(): self.acked(p, s, err))
            self.producer.poll(0.005)
        self.producer.flush(60)


def _file_handler(path: str) -> logging.Handler:
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    return handler


class _Sink(logging.Handler):
    def __init__(self, client: RdKafka):
        super().__init__(logging.DEBUG)
        self.client = client

    def emit(self, record: logging.LogRecord) -> None:
        self.client.saw(record.getMessage())


class KafkaPython(Client):
    def __init__(self, name: str, bootstrap: str):
        super().__init__(name)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        self.producer._metadata.add_listener(self._metadata)

    def _metadata(self, cluster) -> None:
        now = time.time()
        for p in range(PARTITIONS):
            leader = cluster.leader_for_partition(KPTopicPartition(TOPIC, p))
            self.leaders.append((now, p, -1 if leader is None else leader))

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in range(PARTITIONS):
                if self.in_flight[p] < self.window:
                    self.in_flight[p] += 1
                    future = self.producer.send(TOPIC, b"x", partition=p)
                    sent = time.time()
                    future.add_both(lambda result, p=p, s=sent: self.acked(
                        p, s, result if isinstance(result, Exception) else None))
            time.sleep(0.005)
        self.producer.flush(60)


def broker_lines(handle, since: float) -> dict[int, list[tuple[float, str]]]:
    """Each broker's log lines at or after `since` (wall time), parsed."""
    out = {}
    for broker_id, broker in handle.brokers.items():
        lines = []
        for line in broker.read_stderr().splitlines():
            m = LINE.match(line)
            if m:
                at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if at >= since:
                    lines.append((at, m.group(2)))
        out[broker_id] = lines
    return out


def first(lines, pattern: str) -> float | None:
    rx = re.compile(pattern)
    return next((at for at, text in lines if rx.search(text)), None)


def timeline(handle, killed_at: float, dead: int, partition: int, clients: list[Client]) -> dict[str, float | None]:
    logs = broker_lines(handle, killed_at - 0.5)
    survivors = {b: lines for b, lines in logs.items() if b != dead}
    row: dict[str, float | None] = {}
    expiry = [first([x for x in lines if x[0] >= killed_at], r"^controller: (brokers|controller) event")
              for lines in survivors.values()]
    row["expiry"] = min((t for t in expiry if t is not None), default=None)
    elected, new_leader, epoch = None, None, None
    for lines in survivors.values():
        for at, text in lines:
            m = re.search(rf"controller: {TOPIC}-{partition} leader (\d+) epoch (\d+) .*\(offline election\)", text)
            if m and at >= killed_at and int(m.group(1)) != dead:
                elected, new_leader, epoch = at, int(m.group(1)), int(m.group(2))
                break
    row["elected"] = elected
    named = rf"{TOPIC}-{partition} leader {new_leader} epoch {epoch}\b"
    row["LAI"] = first(survivors.get(new_leader, []), rf"^LeaderAndIsr .*{named}") if new_leader else None
    applied = [first(lines, rf"^UpdateMetadata .*{named}") for lines in survivors.values()] if new_leader else [None]
    row["UM all"] = None if None in applied else max(applied)
    for client in clients:
        row[f"{client.name} md"] = client.first_leader_after(partition, killed_at, dead)
        row[f"{client.name} ack"] = client.first_ack_after(partition, killed_at)
    return {k: (None if v is None else v - killed_at) for k, v in row.items()}


def refollow_waits(handle, target: int, since: float, until: float) -> list[float]:
    """On the surviving brokers, for each partition a LeaderAndIsr told them to follow (from
    `since` to `until`), the time until it was truncated: from then on it is fetched again,
    and acks=all on it waits for nothing else. A retry or a LeaderAndIsr held behind the
    fetcher's long poll of its other partitions shows here as ~replica.fetch.wait.max.ms."""
    waits = []
    for broker_id, lines in broker_lines(handle, since).items():
        if broker_id == target:
            continue
        followed: dict[str, float] = {}
        for at, text in lines:
            m = re.match(r"following (\S+) from broker", text)
            if m and at <= until:
                followed[m.group(1)] = at
            m = re.match(r"(\S+) truncated to", text)
            if m and m.group(1) in followed:
                waits.append(at - followed.pop(m.group(1)))
    return waits


def sigterm_round(handle, target: int, clients: list[Client], threshold: float) -> tuple[list, list[float]]:
    """SIGTERM of `target` (controlled shutdown), then it starts again. Per client, the longest
    gap between acknowledgements of the partition it led, from the SIGTERM until a second
    after it exited; a gap over `threshold` prints every broker's log lines around it."""
    partition = target - 1
    signalled = time.time()
    handle.brokers[target].stop()
    time.sleep(1.0)
    until = time.time()
    gaps = [c.longest_gap(partition, signalled, until) for c in clients]
    waits = refollow_waits(handle, target, signalled, until)
    if max(g for g, _ in gaps) > threshold:
        begin = min(at for g, at in gaps if g > threshold)
        end = begin + max(g for g, _ in gaps)
        seen = [(c.name, round(g, 3), round(at - signalled, 3)) for c, (g, at) in zip(clients, gaps)]
        print(f"--- gap over {threshold:.1f} s (client, gap, its start after the SIGTERM): {seen}")
        for broker_id, lines in broker_lines(handle, signalled - 0.1).items():
            for at, text in lines:
                if begin - 0.3 <= at <= end + 0.1 and not text.startswith(("Sending", "Received", "Read")):
                    print(f"  [{broker_id}] +{at - signalled:.3f} {text[:220]}")
    handle.brokers[target].start()
    return gaps, waits


def elect_preferred(bootstrap: str) -> None:
    while True:
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result
        try:
            admin.elect_leaders(
                ElectionType.PREFERRED, [CKTopicPartition(TOPIC, p) for p in range(PARTITIONS)]).result(30)
        except (KafkaException, TimeoutError):
            time.sleep(0.5)  # NOT_CONTROLLER while the controller moves; ELECTION_NOT_NEEDED is fine
        metadata = admin.list_topics(TOPIC, timeout=10)
        parts = metadata.topics[TOPIC].partitions
        if (len(parts) == PARTITIONS and all(parts[p].leader == p + 1 for p in range(PARTITIONS))
                and all(len(parts[p].isrs) == 3 for p in range(PARTITIONS))):
            return
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bounces", type=int, default=6)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--sigterms", type=int, default=0,
                        help="then as many rounds of SIGTERM (controlled shutdown) of a leader")
    parser.add_argument("--gap-threshold", type=float, default=0.8,
                        help="a SIGTERM round with a longer gap prints the brokers' logs around it")
    parser.add_argument("--root", help="keep the cluster's files (the brokers' logs) here")
    parser.add_argument("--client-trace", metavar="PREFIX",
                        help="log the `rdkafka` client's debug lines (broker,topic,msg,protocol) to PREFIX-rdkafka.log "
                             "and kafka-python's to PREFIX-kafka-python.log")
    args = parser.parse_args()
    if args.client_trace:
        kafka_logger = logging.getLogger("kafka")
        kafka_logger.setLevel(logging.DEBUG)
        kafka_logger.addHandler(_file_handler(f"{args.client_trace}-kafka-python.log"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the cluster's processes are stopped on the way out
    with cluster(brokers=3, config=CONFIG, session_timeout_ms=args.session_timeout_ms, log_level="debug",
                 root=args.root) as handle:
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS,
                                      replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]],
                                      config={"min.insync.replicas": "2"})])[TOPIC].result(60)
        elect_preferred(handle.bootstrap)
        trace = f"{args.client_trace}-rdkafka.log" if args.client_trace else None
        clients: list[Client] = [RdKafka("rdkafka", handle.bootstrap, {}, trace=trace),
                                 RdKafka("rdkafka-backoff100", handle.bootstrap, {"retry.backoff.max.ms": 100}),
                                 RdKafka("rdkafka-50", handle.bootstrap, {}, window=50),
                                 KafkaPython("kafka-python", handle.bootstrap)]
        for client in clients:
            client.start()
        rows, shutdowns, refollows = [], [], []
        try:
            for bounce in range(args.bounces):
                elect_preferred(handle.bootstrap)
                controller = AdminClient({"bootstrap.servers": handle.bootstrap}).list_topics(timeout=10).controller_id
                others = sorted(set(handle.brokers) - {controller})
                target = controller if bounce % 3 == 0 else others[bounce % 2]
                partition = target - 1
                time.sleep(2)  # a steady pace first
                killed_at = time.time()
                handle.brokers[target].kill()
                deadline = time.monotonic() + 60
                while any(c.first_ack_after(partition, killed_at) is None for c in clients):
                    if time.monotonic() > deadline:
                        errors = [c.errors[-3:] for c in clients]
                        raise RuntimeError(f"no acknowledgement 60 s after the kill: {errors}")
                    time.sleep(0.05)
                time.sleep(0.5)  # the last log lines
                row = timeline(handle, killed_at, target, partition, clients)
                rows.append((bounce + 1, target, target == controller, row))
                progress(f"bounce {bounce + 1}: broker {target}{' (controller)' if target == controller else ''}: "
                         + ", ".join(f"{k} {'-' if v is None else f'{v:.2f}'}" for k, v in row.items()))
                handle.brokers[target].start()
            for n in range(args.sigterms):
                elect_preferred(handle.bootstrap)
                target = n % 3 + 1
                time.sleep(2)
                gaps, waits = sigterm_round(handle, target, clients, args.gap_threshold)
                shutdowns.append(gaps)
                refollows.extend(waits)
                progress(f"SIGTERM {n + 1} of broker {target}: longest gaps "
                         + ", ".join(f"{c.name} {g * 1000:.0f} ms" for c, (g, _) in zip(clients, gaps))
                         + f"; LeaderAndIsr to truncated on the followers, max {max(waits, default=0) * 1000:.0f} ms")
        finally:
            for client in clients:
                client.stop()
    if shutdowns:
        print()
        print(f"| SIGTERM of a leader, longest gap between acknowledgements ({len(shutdowns)} rounds) "
              "| median | max | rounds over 1 s |")
        print("| --- | ---: | ---: | ---: |")
        for i, client in enumerate(clients):
            gaps = sorted(r[i][0] for r in shutdowns)
            print(f"| {client.name} | {statistics.median(gaps) * 1000:.0f} ms | {gaps[-1] * 1000:.0f} ms "
                  f"| {sum(g > 1 for g in gaps)} |")
        if refollows:
            refollows.sort()
            print(f"\nA partition the followers were told to follow, LeaderAndIsr to truncated ({len(refollows)}): "
                  f"median {statistics.median(refollows) * 1000:.0f} ms, "
                  f"p90 {refollows[int(len(refollows) * 0.9)] * 1000:.0f} ms, max {refollows[-1] * 1000:.0f} ms, "
                  f"{sum(w > 0.3 for w in refollows)} over 300 ms")
    if not rows:
        return
    columns = list(rows[0][3])
    print()
    print("| bounce | broker killed | " + " | ".join(columns) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in columns) + " |")
    for bounce, target, was_controller, row in rows:
        cells = " | ".join("-" if row[c] is None else f"{row[c]:.2f}" for c in columns)
        print(f"| {bounce} | {target}{' (controller)' if was_controller else ''} | {cells} |")
    medians = []
    for c in columns:
        values = sorted(r[3][c] for r in rows if r[3][c] is not None)
        medians.append(f"{values[0]:.2f} / {statistics.median(values):.2f} / {values[-1]:.2f}" if values else "-")
    print("| min / median / max | | " + " | ".join(medians) + " |")


if __name__ == "__main__":
    main()
