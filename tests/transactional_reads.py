"""Reading transactional output the way the exactly-once tests check it: wait until every
transaction that touched the partitions has its marker (LSO == high watermark), then read
to the end of each partition with a real consumer at the chosen isolation level."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ottla.end_offsets import list_offsets

SETTLE_LIMIT_S = 180     # guards against hangs only; nothing asserts how fast anything is


def end_offsets(admin: AdminClient, partitions: list[TopicPartition], isolation: IsolationLevel) -> dict:
    answers = list_offsets(admin, {tp: OffsetSpec.latest() for tp in partitions}, isolation_level=isolation,
                           timeout_s=15)
    return {(tp.topic, tp.partition): info.offset for tp, info in answers.items()}


def wait_until_stable(bootstrap: str, partitions: list[TopicPartition]) -> dict:
    """High watermarks, once every partition's last stable offset has reached its high
    watermark: every transaction that touched them has its marker."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while True:
        try:
            stable = end_offsets(admin, partitions, IsolationLevel.READ_COMMITTED)
            high = end_offsets(admin, partitions, IsolationLevel.READ_UNCOMMITTED)
        except KafkaException:
            stable, high = None, None          # the broker is still starting
        if stable is not None and stable == high:
            return high
        assert time.monotonic() < deadline, f"transactions never completed: LSO {stable} vs HW {high}"
        time.sleep(0.2)


def read_all(bootstrap: str, partitions: list[TopicPartition], isolation: str) -> list[tuple[str, int, int, bytes]]:
    """(topic, partition, offset, value) of everything readable at `isolation`, up to the end
    of every partition (partition EOF), in offset order per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(tp.topic, tp.partition, 0) for tp in partitions])
    pending = {(tp.topic, tp.partition) for tp in partitions}
    records = []
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while pending:
        assert time.monotonic() < deadline, f"no end of partition reached on {sorted(pending)}"
        for message in consumer.consume(1000, 0.5):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                pending.discard((message.topic(), message.partition()))
            elif error is not None:
                raise KafkaException(error)
            else:
                records.append((message.topic(), message.partition(), message.offset(), message.value()))
    consumer.close()
    return records

