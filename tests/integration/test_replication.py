"""Replication on a real ZooKeeper and three real `ottla serve` processes, with real clients.

Replication factor 3 with min.insync.replicas=2: an idempotent acks=all producer goes on
through a kill -9 of the leader, every acknowledged record is on the new leader exactly once
and in order, and once the old leader is back and caught up the three logs are the same
batch by batch. A follower cut off by a TCP proxy leaves the ISR after
replica.lag.time.max.ms and rejoins once the cut ends; with both followers cut off acks=all
gets NOT_ENOUGH_REPLICAS.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from ottla.records.batch import read_header
from ottla.testing import cluster
from ottla.testing.zookeeper import free_port
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for

LAG_MS = 3000
CONFIG = {"replica.lag.time.max.ms": LAG_MS, "replica.fetch.backoff.ms": 200}


def partition_info(bootstrap: str, topic: str, partition: int = 0):
    """(leader, replicas, isr) as Metadata answers, or None."""
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    except KafkaException:
        return None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or partition not in info.partitions:
        return None
    p = info.partitions[partition]
    return p.leader, tuple(p.replicas), tuple(sorted(p.isrs))


def create_replicated(three, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    wait_for(lambda: (lambda i: i is not None and i[0] >= 0 and len(i[2]) == 3)(partition_info(three.bootstrap, topic)),
             what=f"{topic} led with a full ISR")


def segment_batches(data_dir: Path, topic: str, below: int) -> list[bytes]:
    """The batches of the partition's segment files that start below offset `below`, as bytes,
    in offset order (read while the broker runs: an active segment may be pre-allocated past
    its last batch, so the walk stops there)."""
    out = []
    for segment in sorted((data_dir / f"{topic}-0").glob("*.log")):
        buf = segment.read_bytes()
        position = 0
        while position + 61 <= len(buf):
            header = read_header(buf, position)
            if header.batch_length <= 0 or header.base_offset >= below:
                break
            out.append(buf[position:position + 12 + header.batch_length])
            position += 12 + header.batch_length
    return out


def base_offset(batch: bytes) -> int:
    return int.from_bytes(batch[:8], "big")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    with cluster(brokers=3, config=CONFIG, root=tmp_path_factory.mktemp("replication")) as handle:
        yield handle


class SteadyProducer:
    """An idempotent acks=all producer sending 0, 1, 2, ... and recording what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str):
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 120000, "retry.backoff.ms": 100})
        self.topic = topic
        self.acked: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg):
        if err is None:
            self.acked.append(int(msg.value()))
        else:
            self.errors.append(str(err))

    def _run(self):
        n = 0
        while not self._stop.is_set():
            if n - len(self.acked) - len(self.errors) < 100:  # a steady rate: at most 100 in flight
                self.producer.produce(self.topic, str(n).encode(), on_delivery=self._delivered)
                n += 1
            self.producer.poll(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.producer.flush(120)

    def __exit__(self, *exc):
        if not self._stop.is_set():
            self.stop()


def test_leader_kill_loses_no_acknowledged_record_and_replicas_converge(three):
    topic = "replicated"
    create_replicated(three, topic)
    with SteadyProducer(three.bootstrap, topic) as producer:
        wait_for(lambda: len(producer.acked) >= 300, what="records acknowledged")
        leader = partition_info(three.bootstrap, topic)[0]
        three.brokers[leader].kill()
        at_kill = len(producer.acked)
        survivors = ",".join(b.bootstrap for i, b in three.brokers.items() if i != leader)
        wait_for(lambda: (lambda i: i is not None and i[0] not in (-1, leader))(partition_info(survivors, topic)),
                 what="a new leader")
        wait_for(lambda: len(producer.acked) >= at_kill + 300, what="records acknowledged by the new leader")
        three.brokers[leader].start()
        wait_for(lambda: (lambda i: i is not None and len(i[2]) == 3)(partition_info(three.bootstrap, topic)),
                 what="the old leader back in the ISR")
        wait_for(lambda: len(producer.acked) >= at_kill + 600, what="records acknowledged with three in sync")
        assert producer.stop() == 0
    assert producer.errors == []

    consumer = KafkaConsumer(bootstrap_servers=three.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    high_watermark = consumer.end_offsets([tp])[tp]
    values = [int(m.value) for m in consumer]
    consumer.close()
    assert len(values) == high_watermark
    assert values == sorted(values) and len(set(values)) == len(values)  # in order, exactly once
    assert set(producer.acked) <= set(values)

    # The three logs agree batch by batch below the high watermark: every ISR member, the old
    # leader included, has everything below it.
    logs = {i: segment_batches(h.data_dir, topic, high_watermark) for i, h in three.brokers.items()}
    reference = logs[next(iter(logs))]
    assert reference and base_offset(reference[0]) == 0
    last = reference[-1]
    assert base_offset(last) + int.from_bytes(last[23:27], "big") + 1 == high_watermark
    for broker_id, batches in logs.items():
        assert batches == reference, f"broker {broker_id}'s log differs"


FETCH = 1


def test_cut_off_followers_leave_the_isr_and_rejoin_and_acks_all_needs_min_insync(tmp_path):
    """Broker 3 (the leader) advertises a TCP proxy, so its followers fetch through it."""
    topic = "cut"
    with FaultProxy(seed=13) as proxy, cluster(brokers=2, config=CONFIG, root=tmp_path) as two:
        leader = two.add_broker(start=False)
        leader.port = free_port()  # the proxy leads there before the broker starts: the
        proxy.upstream = ("127.0.0.1", leader.port)  # controller reaches it only through the proxy
        leader.extra_args += ["--advertised", proxy.address]
        leader.start()
        admin = AdminClient({"bootstrap.servers": two.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[3, 1, 2]],
                                      config={"min.insync.replicas": "2"})])[topic].result(60)
        bootstrap = two.bootstrap

        def isr():
            info = partition_info(bootstrap, topic)
            return info[2] if info is not None and info[0] == 3 else None

        wait_for(lambda: isr() == (1, 2, 3), what="a full ISR")
        with SteadyProducer(bootstrap, topic) as producer:
            wait_for(lambda: len(producer.acked) >= 100, what="records acknowledged")
            # Follower 1's fetches reach the leader but their answers never come back.
            proxy.drop_responses(1.0, api_key=FETCH, client_id="broker-1-fetcher-0")
            cut_at = time.monotonic()
            wait_for(lambda: isr() == (2, 3), what="broker 1 out of the ISR")
            assert time.monotonic() - cut_at >= LAG_MS / 1000 * 0.9  # not before replica.lag.time.max.ms
            acked = len(producer.acked)
            wait_for(lambda: len(producer.acked) >= acked + 100, what="acks=all with ISR [2, 3]")
            proxy.clear_faults()
            wait_for(lambda: isr() == (1, 2, 3), what="broker 1 back in the ISR")
            assert producer.stop() == 0
        assert producer.errors == []

        # Both followers cut off: the ISR shrinks to the leader, below min.insync.replicas.
        proxy.drop_responses(1.0, api_key=FETCH)
        one = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})

        def shrunk():  # acks=1 keeps the leader's log growing, so the followers fall behind
            one.produce(topic, b"acks=1")
            one.flush(10)
            return isr() == (3,)
        wait_for(shrunk, what="the ISR down to the leader")
        strict = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                           "retries": 0, "message.timeout.ms": 30000})
        outcome = []
        strict.produce(topic, b"lonely", on_delivery=lambda err, msg: outcome.append(err))
        strict.flush(60)
        assert [e.code() if e is not None else None for e in outcome] == [CKafkaError.NOT_ENOUGH_REPLICAS]
        proxy.clear_faults()
        wait_for(lambda: isr() == (1, 2, 3), what="both followers back in the ISR")
