"""The hostile load of issue 11, lean (the full one is `benchmarks/load.py`): thousands of idle
connections and consumers that never read their responses, some of them old clients whose
fetches the broker down-converts, all asking for gigabytes, while a bystander produces and
consumes. The broker's peak RSS stays within the bound docs/architecture.md ("Bounds")
states for it, and the bystander's data is byte-exact; its latency is reported, not asserted."""

import resource
import socket
import statistics
import time
from datetime import timedelta

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

from ottla.protocol.schemas import request_schema
from tests.waiting import wait_for
from tests.wire import encode_request, process_memory, stuck_consumers, unread_bytes

IDLE = 2000
# Consumers sending one Fetch for everything and never reading: Fetch v11, v3 (message
# format v1) and v1 (format v0), both down-converted by the broker.
STUCK = {11: 100, 3: 40, 1: 10}
FILL_MB = 8  # in the fetched partition: each stuck consumer's response would be all of it
BYSTANDER_RECORDS = 300
# docs/architecture.md, "Bounds": a started broker, 1 MiB per connection with a response in
# flight that is not read, 32 KiB per idle connection.
BASE_BOUND = 64 << 20
PER_STUCK_BOUND = 1 << 20
PER_IDLE_BOUND = 32 << 10


def _fetch(version: int) -> bytes:
    """Fetch of all of 'load' from offset 0, asking for 2 GiB."""
    everything = 2**31 - 1
    if version == 11:
        return encode_request(FetchRequest(max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=everything,
                                           topics=(FetchTopic(topic="load", partitions=(FetchPartition(
                                               partition=0, fetch_offset=0, partition_max_bytes=everything),)),),
                                           forgotten_topics_data=()))
    request = request_schema(1, version)
    topic = request.__dataclass_fields__["topics"].type.__args__[0]
    partition = topic.__dataclass_fields__["partitions"].type.__args__[0]
    extra = {"max_bytes": everything} if version >= 3 else {}
    return encode_request(request(replica_id=-1, max_wait=timedelta(milliseconds=500), min_bytes=1, topics=(
        topic(topic="load", partitions=(partition(partition=0, fetch_offset=0, partition_max_bytes=everything),)),),
        **extra))


def _bystander(bootstrap: str) -> list[float]:
    """Produce BYSTANDER_RECORDS records one at a time (acks=all), consume them back and check
    them byte for byte; returns the produce latencies in ms."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    values = [bytes([i % 256]) * (100 + i) for i in range(BYSTANDER_RECORDS)]
    latencies = []
    for value in values:
        sent = time.monotonic()
        producer.produce("bystander", value, key=value[:8])
        assert producer.flush(60) == 0
        latencies.append((time.monotonic() - sent) * 1000)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bystander", "enable.auto.commit": False})
    consumer.assign([TopicPartition("bystander", 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None:
            assert message.error() is None, message.error()
            got.append((message.key(), message.value()))
    consumer.close()
    assert got == [(value[:8], value) for value in values]
    return latencies


def test_idle_connections_and_consumers_that_never_read_keep_rss_within_the_bound(ottla_broker_factory):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = IDLE + sum(STUCK.values()) + 100
    assert hard >= needed, f"RLIMIT_NOFILE hard limit {hard} is below the {needed} descriptors this test needs"
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as `ottla serve` does for itself
    opened: list[socket.socket] = []
    try:
        broker = ottla_broker_factory()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("load", 1, 1), NewTopic("bystander", 1, 1)]).values():
            future.result(60)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
        for i in range(FILL_MB * 100):
            producer.produce("load", bytes([i % 256]) * 10_000)
            producer.poll(0)
        assert producer.flush(120) == 0
        before = process_memory(broker.pid, "VmRSS")

        address = (broker.host, broker.port)
        for _ in range(IDLE):
            opened.append(socket.create_connection(address, timeout=30))
        stuck = []
        for version, count in STUCK.items():
            stuck += stuck_consumers(broker.host, broker.port, _fetch(version), count)
            opened += stuck[-count:]
        # Every stuck consumer has the start of its response waiting in its socket: the broker
        # has read and converted what it will hold for each.
        wait_for(lambda: all(unread_bytes(sock) > 0 for sock in stuck), timeout=120,
                 what="the broker writing to every stuck consumer")

        latencies = _bystander(broker.bootstrap)
        q = statistics.quantiles(latencies, n=100)
        peak = process_memory(broker.pid, "VmHWM")
        bound = BASE_BOUND + len(stuck) * PER_STUCK_BOUND + IDLE * PER_IDLE_BOUND
        print(f"\n{IDLE} idle connections, {len(stuck)} consumers that never read ({STUCK} by Fetch version), "
              f"{FILL_MB} MB fetched by each: broker RSS {before >> 20} MiB before, peak {peak >> 20} MiB "
              f"(bound {bound >> 20} MiB); bystander acks=all produce p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, "
              f"max {max(latencies):.1f} ms ({len(latencies)} records, byte-exact)")
        assert broker.running()
        assert peak < bound, f"peak RSS {peak >> 20} MiB over the bound of {bound >> 20} MiB"
    finally:
        for sock in opened:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
