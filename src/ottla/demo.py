"""`make demo`: start an embedded broker, create a topic, produce and consume with a real client."""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .testing import broker

TOPIC = "demo-events"
PARTITIONS = 3
RECORDS = 5000


def _say(message: str) -> None:
    print(message, flush=True)


def run() -> int:
    started = time.monotonic()
    with broker() as handle:
        _say(f"[1/4] broker started at {handle.bootstrap} (data in {handle.data_dir})")
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(10)
        _say(f"[2/4] created topic {TOPIC} with {PARTITIONS} partitions")

        producer = Producer({"bootstrap.servers": handle.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "compression.type": "lz4"})
        failures = []
        for i in range(RECORDS):
            producer.produce(TOPIC, key=f"account-{i % 17}", value=f"event {i}",
                             on_delivery=lambda err, msg: err and failures.append(err))
            if i % 1000 == 999:
                producer.poll(0)
                _say(f"      produced {i + 1}/{RECORDS}")
        producer.flush(30)
        if failures:
            _say(f"delivery failed: {failures[0]}")
            return 1
        _say(f"[3/4] produced {RECORDS} records (idempotent, lz4)")

        consumer = Consumer({"bootstrap.servers": handle.bootstrap, "group.id": "demo", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        seen = {}
        deadline = time.monotonic() + 60
        while len(seen) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            seen[message.value()] = message.offset()
        consumer.close()
        _say(f"[4/4] consumed {len(seen)} distinct records back")
    elapsed = time.monotonic() - started
    ok = len(seen) == RECORDS
    _say(f"{'OK' if ok else 'MISMATCH'}: {RECORDS} produced, {len(seen)} consumed in {elapsed:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run())
