"""Replication cost and failover on three brokers (`ottla.testing.cluster`, a real ZooKeeper).

1. Produce throughput, acks=all, replication factor 3 (min.insync.replicas=2) against
   replication factor 1 on the same cluster: records/s and the ratio.
2. End-to-end latency with acks=all, RF=3: a producer sends one record at a time (timestamp
   in the value), a consumer reads it; p50/p99 of receive time minus send time.
3. Failover: kill -9 of the RF=3 partition's leader while an idempotent acks=all producer
   runs; the time from the kill to the first record acknowledged by the new leader.
4. Controlled shutdown: SIGTERM of the RF=3 partition's leader (ControlledShutdown moves the
   leadership first) while the same producer runs, `--shutdown-rounds` times; the longest gap
   between two acknowledgements from the SIGTERM until a second after the broker exited
   (against the longest gap in the 2 s before: the producer's own pace).
5. Many partitions (`--cases wide`): `--wide-records` records spread round-robin over a topic of
   `--wide-partitions` partitions (RF=3, min.insync.replicas=2), once with acks=all and once with
   acks=1: records/s and each record's produce latency (produce() to its delivery report)
   p50/p99. librdkafka sends one partition per ProduceRequest and a connection is served one
   request at a time, so acks=all here is bound by how fast a follower fetch round moves the
   high watermark. `--wide-clients confluent,kafka-python` adds kafka-python's producer, which
   sends every ready partition of a broker in one request. `--wide-rounds N` instead sends N
   acks=all records one at a time (each flushed): the latency of one replication round.
6. Behind long polls (`--cases long-polls`): `--long-polls` consumers long-poll the RF=3
   partition at its leader (raw Fetch v11 from offset 0, min_bytes 1 MB, max_wait 500 ms: every
   append wakes all of them, and each reads and waits again), while an acks=all producer sends
   one record at a time: produce latency p50/p99, which waits for a follower's fetch.

    PYTHONPATH=src python benchmarks/replication.py [--records 50000] [--latency-samples 500] [--shutdown-rounds 5]
    PYTHONPATH=src python benchmarks/replication.py --cases wide [--wide-partitions 1000] [--wide-records 100000]
        [--wide-clients confluent,kafka-python] [--wide-rounds 100]
    PYTHONPATH=src python benchmarks/replication.py --cases long-polls [--long-polls 2000] [--latency-samples 300]
"""

from __future__ import annotations

import argparse
import resource
import select
import socket
import statistics
import threading
import time
from datetime import timedelta

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from ottla.testing import cluster
from ottla.testing.fuzz import encode

CONFIG = {"replica.lag.time.max.ms": 10000}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def leader_of(bootstrap: str, topic: str) -> int:
    while True:
        info = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
        if info is not None and info.error is None and 0 in info.partitions:
            p = info.partitions[0]
            if p.leader >= 0 and len(p.isrs) == len(p.replicas):
                return p.leader
        time.sleep(0.2)


def create(bootstrap: str, topic: str, factor: int) -> None:
    configs = {"min.insync.replicas": "2"} if factor == 3 else {}
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result
    admin.create_topics([NewTopic(topic, 1, factor, config=configs)])[topic].result(60)
    leader_of(bootstrap, topic)


def throughput(bootstrap: str, topic: str, records: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True})
    value = b"x" * 100
    start = time.monotonic()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(120) == 0
    return records / (time.monotonic() - start)


def latency(bootstrap: str, topic: str, samples: int) -> tuple[float, float]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{topic}", "auto.offset.reset": "latest",
                         "fetch.wait.max.ms": 10})
    consumer.subscribe([topic])
    while not consumer.assignment():
        consumer.poll(0.2)
    time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    seen = []
    for _ in range(samples):
        producer.produce(topic, str(time.monotonic()).encode())
        producer.flush(10)
        while True:
            message = consumer.poll(5)
            if message is not None and message.error() is None:
                seen.append((time.monotonic() - float(message.value())) * 1000)
                break
    consumer.close()
    seen.sort()
    return statistics.median(seen), seen[int(len(seen) * 0.99) - 1]


def create_wide(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})])[topic].result(120)
    while True:  # every partition led and its ISR full
        info = admin.list_topics(topic, timeout=30).topics.get(topic)
        if (info is not None and info.error is None and len(info.partitions) == partitions
                and all(p.leader >= 0 and len(p.isrs) == 3 for p in info.partitions.values())):
            return
        time.sleep(0.5)


def wide(bootstrap: str, topic: str, partitions: int, records: int, acks: str) -> tuple[float, float, float]:
    """records/s and produce latency p50/p99 (ms) of `records` 100-byte records spread
    round-robin over `partitions` partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                         "message.timeout.ms": 1800000})
    latencies: list[float] = []

    def delivered(err, _msg, sent):
        assert err is None, err
        latencies.append(time.monotonic() - sent)
    value = b"x" * 100
    start = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions,
                                 on_delivery=lambda err, msg, sent=time.monotonic(): delivered(err, msg, sent))
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(1800) == 0
    elapsed = time.monotonic() - start
    latencies.sort()
    return records / elapsed, latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def wide_kafka_python(bootstrap: str, topic: str, partitions: int, records: int, acks: str
                      ) -> tuple[float, float, float]:
    """`wide` with kafka-python's producer, which puts every ready partition of a broker in one
    ProduceRequest (librdkafka: one partition per request), at most 5 in flight per connection."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=-1 if acks == "all" else int(acks), linger_ms=5,
                             request_timeout_ms=1800000, delivery_timeout_ms=1800000 + 5)
    latencies: list[float] = []
    value = b"x" * 100
    start = time.monotonic()
    for i in range(records):
        sent = time.monotonic()
        producer.send(topic, value, partition=i % partitions).add_callback(
            lambda _metadata, sent=sent: latencies.append(time.monotonic() - sent))
    producer.flush(1800)
    elapsed = time.monotonic() - start
    producer.close()
    assert len(latencies) == records, f"{records - len(latencies)} records not acknowledged"
    latencies.sort()
    return records / elapsed, latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def wide_rounds(bootstrap: str, topic: str, partitions: int, rounds: int) -> tuple[float, float]:
    """p50/p90 (ms) of one acks=all record at a time, each flushed before the next (partition
    7i mod `partitions`): one replication round each, nothing else in flight."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(30):  # warm: connections, metadata, the followers' sessions
        producer.produce(topic, b"w", partition=i % partitions)
        producer.flush(60)
    took = []
    for i in range(rounds):
        start = time.monotonic()
        producer.produce(topic, b"x" * 100, partition=(i * 7) % partitions)
        assert producer.flush(60) == 0
        took.append((time.monotonic() - start) * 1000)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.9)]


def wide_case(bootstrap: str, partitions: int, records: int, clients: tuple[str, ...] = ("confluent",),
              rounds: int = 0) -> None:
    create_wide(bootstrap, "wide", partitions)
    if rounds:
        p50, p90 = wide_rounds(bootstrap, "wide", partitions, rounds)
        progress(f"{partitions} partitions, one acks=all record at a time: p50 {p50:.1f} ms p90 {p90:.1f} ms")
        print(f"| one acks=all round over {partitions:,} partitions ({rounds} records one at a time) "
              f"| p50 {p50:.1f} ms, p90 {p90:.1f} ms |")
        return
    rows = []
    for client in clients:
        run = wide if client == "confluent" else wide_kafka_python
        for acks in ("all", "1"):
            run(bootstrap, "wide", partitions, min(records, partitions * 2), acks)  # warm: connections, metadata
            rate, p50, p99 = run(bootstrap, "wide", partitions, records, acks)
            progress(f"{client}: {partitions} partitions acks={acks}: {rate:,.0f} records/s, "
                     f"p50 {p50:.0f} ms p99 {p99:.0f} ms")
            rows.append((client, acks, rate, p50, p99))
    print()
    print(f"| {records:,} records over {partitions:,} partitions, RF=3 | records/s | produce latency p50 / p99 |")
    print("| --- | ---: | ---: |")
    for client, acks, rate, p50, p99 in rows:
        print(f"| {client} acks={acks} | {rate:,.0f} | {p50:,.0f} / {p99:,.0f} ms |")


def _long_polls(address: tuple[str, int], topic: str, count: int, stop: threading.Event) -> None:
    """`count` raw consumers long-polling `topic`-0 from offset 0 with min_bytes 1 MB until `stop`."""
    from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

    wanted = FetchTopic(topic=topic, partitions=(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),))
    fetch = encode(FetchRequest(max_wait=timedelta(milliseconds=500), min_bytes=1 << 20, max_bytes=1 << 20,
                                topics=(wanted,), forgotten_topics_data=()), 1)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    consumers, poller = {}, select.poll()
    for _ in range(count):
        sock = socket.create_connection(address)
        sock.sendall(fetch)
        sock.setblocking(False)
        consumers[sock.fileno()] = [sock, b""]
        poller.register(sock.fileno(), select.POLLIN)
    try:
        while not stop.is_set():
            for fd, _ in poller.poll(200):
                consumer = consumers[fd]
                consumer[1] += consumer[0].recv(1 << 20)
                while len(consumer[1]) >= 4 and len(consumer[1]) >= 4 + int.from_bytes(consumer[1][:4], "big"):
                    consumer[1] = consumer[1][4 + int.from_bytes(consumer[1][:4], "big"):]
                    consumer[0].sendall(fetch)
    finally:
        for sock, _ in consumers.values():
            sock.close()


def long_polls_case(handle, polls: int, samples: int) -> None:
    create(handle.bootstrap, "polled", 3)
    leader = handle.brokers[leader_of(handle.bootstrap, "polled")]
    host, _, port = leader.bootstrap.rpartition(":")
    stop = threading.Event()
    pollers = threading.Thread(target=_long_polls, args=((host, int(port)), "polled", polls, stop), daemon=True)
    pollers.start()
    time.sleep(3)  # all of them waiting
    producer = Producer({"bootstrap.servers": handle.bootstrap, "acks": "all", "linger.ms": 0})
    seen: list[float] = []
    try:
        for _ in range(samples):
            sent = time.monotonic()
            producer.produce("polled", b"x" * 20)
            assert producer.flush(30) == 0
            seen.append((time.monotonic() - sent) * 1000)
    finally:
        stop.set()
        pollers.join()
    seen.sort()
    print()
    print(f"| acks=all RF=3, one record at a time, {polls:,} consumers long-polling its partition | p50 | p99 |")
    print("| --- | ---: | ---: |")
    print(f"| produce latency ({samples} records) | {statistics.median(seen):.1f} ms | "
          f"{seen[int(len(seen) * 0.99) - 1]:.1f} ms |")


def failover_producer(bootstrap: str) -> Producer:
    """An idempotent acks=all producer that sends one record at a time and re-asks for leaders
    often, so the gaps between its acknowledgements show the broker's unavailability."""
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 0, "message.timeout.ms": 120000, "retry.backoff.ms": 20,
                     "topic.metadata.refresh.interval.ms": 500})


def failover(handle, topic: str) -> float:
    acked: list[tuple[float, float]] = []  # (sent, acknowledged)
    producer = failover_producer(handle.bootstrap)
    stop = threading.Event()

    def run():
        while not stop.is_set():
            sent = time.monotonic()
            producer.produce(topic, b"f", on_delivery=lambda err, msg, sent=sent: err is None and acked.append(
                (sent, time.monotonic())))
            producer.poll(0.002)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while len(acked) < 200:
        time.sleep(0.05)
    leader = leader_of(handle.bootstrap, topic)
    killed_at = time.monotonic()
    handle.brokers[leader].kill()
    # A record sent after the kill can only be acknowledged by the new leader.
    while not [a for s, a in acked if s > killed_at]:
        time.sleep(0.01)
    first = min(a for s, a in acked if s > killed_at)
    stop.set()
    thread.join()
    producer.flush(60)
    handle.brokers[leader].start()
    return first - killed_at


def controlled_shutdown(handle, topic: str, rounds: int) -> list[tuple[float, float, float]]:
    """Per round (the leader SIGTERMed, back and in the ISR before the next): the longest gap
    between acknowledgements from the SIGTERM until a second after the broker exited, the
    longest gap in the 2 s before the SIGTERM (the producer's own pace), and how long the
    broker took to stop."""
    acked: list[float] = []
    producer = failover_producer(handle.bootstrap)
    stop = threading.Event()

    def run():
        while not stop.is_set():
            producer.produce(topic, b"c", on_delivery=lambda err, msg: err is None and acked.append(time.monotonic()))
            producer.poll(0.002)

    def longest_gap(start: float, until: float) -> float:
        times = [start] + [t for t in acked if start < t <= until] + [until]
        return max(b - a for a, b in zip(times, times[1:]))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    results = []
    for _ in range(rounds):
        leader = leader_of(handle.bootstrap, topic)
        time.sleep(3)  # a steady pace first
        signalled = time.monotonic()
        handle.brokers[leader].stop()  # SIGTERM, returns once the broker exited
        stopped = time.monotonic()
        time.sleep(1.0)
        results.append((longest_gap(signalled, stopped + 1.0), longest_gap(signalled - 2.0, signalled),
                        stopped - signalled))
        progress(f"SIGTERM of leader {leader}: longest gap {results[-1][0] * 1000:.0f} ms, "
                 f"{results[-1][1] * 1000:.0f} ms before, stopped in {results[-1][2]:.2f} s")
        handle.brokers[leader].start()
    stop.set()
    thread.join()
    producer.flush(60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--shutdown-rounds", type=int, default=5)
    parser.add_argument("--cases", choices=("single", "wide", "all", "long-polls"), default="single",
                        help="single: measures 1-4 (one-partition topics); wide: measure 5; long-polls: measure 6")
    parser.add_argument("--long-polls", type=int, default=2000)
    parser.add_argument("--wide-partitions", type=int, default=1000)
    parser.add_argument("--wide-records", type=int, default=100000)
    parser.add_argument("--wide-rounds", type=int, default=0,
                        help="instead of measure 5's throughput: this many acks=all records one at a time (latency)")
    parser.add_argument("--wide-clients", default="confluent",
                        help="measure 5's producers, comma-separated: confluent (librdkafka), kafka-python")
    args = parser.parse_args()
    with cluster(brokers=3, config=CONFIG, log_level="warning") as handle:
        progress(f"cluster up: {handle.bootstrap}")
        if args.cases == "long-polls":
            long_polls_case(handle, args.long_polls, args.latency_samples)
            return
        if args.cases in ("wide", "all"):
            wide_case(handle.bootstrap, args.wide_partitions, args.wide_records, tuple(args.wide_clients.split(",")),
                      args.wide_rounds)
        if args.cases == "wide":
            return
        create(handle.bootstrap, "rf1", 1)
        create(handle.bootstrap, "rf3", 3)
        rf1 = throughput(handle.bootstrap, "rf1", args.records)
        progress(f"RF=1: {rf1:,.0f} records/s")
        rf3 = throughput(handle.bootstrap, "rf3", args.records)
        progress(f"RF=3: {rf3:,.0f} records/s")
        p50, p99 = latency(handle.bootstrap, "rf3", args.latency_samples)
        progress(f"latency p50 {p50:.1f} ms p99 {p99:.1f} ms")
        create(handle.bootstrap, "failover", 3)
        gap = failover(handle, "failover")
        progress(f"kill -9 failover: {gap:.2f} s")
        leader_of(handle.bootstrap, "failover")  # the killed broker is back in the ISR
        rounds = controlled_shutdown(handle, "failover", args.shutdown_rounds)
        gaps = sorted(g for g, _, _ in rounds)
        print()
        print("| measure | value |")
        print("| --- | --- |")
        print(f"| produce acks=all, RF=1 (100 B records, idempotent) | {rf1:,.0f} records/s |")
        print(f"| produce acks=all, RF=3, min.insync.replicas=2 | {rf3:,.0f} records/s |")
        print(f"| RF=3 / RF=1 | {rf3 / rf1:.2f} |")
        print(f"| end-to-end latency acks=all RF=3, p50 / p99 ({args.latency_samples} records, one at a time) "
              f"| {p50:.1f} / {p99:.1f} ms |")
        print(f"| kill -9 of the leader -> first acknowledged produce on the new leader "
              f"(zookeeper.session.timeout.ms={handle.session_timeout_ms}) | {gap:.2f} s |")
        print(f"| SIGTERM of the leader (controlled shutdown), longest gap between acknowledgements, "
              f"median / max of {len(gaps)} | {statistics.median(gaps) * 1000:.0f} / {gaps[-1] * 1000:.0f} ms |")
        print(f"| the same producer's longest gap in the 2 s before each SIGTERM, max "
              f"| {max(b for _, b, _ in rounds) * 1000:.0f} ms |")
        print(f"| SIGTERM to exit (controlled shutdown, flush, close), max | {max(c for _, _, c in rounds):.2f} s |")


if __name__ == "__main__":
    main()
