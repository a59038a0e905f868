"""fsync failure (issue 11): an fsync that fails with EIO takes the log directory offline, as
Kafka does; with Ottla's single log directory nothing is left, so the broker says so in one
line and halts: the write whose sync failed is not acknowledged, nor is anything after it.
The next start recovers, and what was acknowledged before is intact.

EIO is injected by `OTTLA_FAILPOINTS=fsync.eio@doomed-` (ottla.durability)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def test_eio_on_fsync_halts_the_broker_and_acknowledges_nothing_after(ottla_broker_factory):
    broker = ottla_broker_factory(env={"OTTLA_FAILPOINTS": "fsync.eio@doomed-"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic("safe", 1, 1), NewTopic("doomed", 1, 1, config={"flush.messages": "1"})])
    for future in futures.values():
        future.result(60)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "message.timeout.ms": 20000,
                         "enable.idempotence": False, "retries": 0})
    outcomes = {}

    def report(topic):
        return lambda err, msg: outcomes.setdefault(topic, err)

    producer.produce("safe", b"acknowledged before", on_delivery=report("safe"))
    producer.flush(60)
    assert outcomes["safe"] is None
    producer.produce("doomed", b"its flush fails", on_delivery=report("doomed"))
    producer.flush(60)
    assert outcomes["doomed"] is not None, "a write whose fsync failed was acknowledged"

    deadline = time.monotonic() + 60
    while broker.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not broker.running() and broker.process.returncode == 1, broker.read_stderr()[-2000:]
    lines = [line for line in broker.read_stderr().splitlines() if "log directory offline" in line]
    assert len(lines) == 1 and "doomed-0" in lines[0] and "Input/output error" in lines[0]

    broker.env = {}
    broker.start()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.auto.commit": False})
    consumer.assign([TopicPartition("safe", 0, 0)])
    message = None
    for _ in range(60):
        message = consumer.poll(1)
        if message is not None and not message.error():
            break
    consumer.close()
    assert message is not None and message.value() == b"acknowledged before"


def test_eio_on_a_cleaner_fsync_halts_the_broker_like_any_other(ottla_broker_factory):
    # The cleaner writes its `.cleaned` files in a worker process; their fsync failing must
    # take the log directory offline in the broker, not just end the worker's pass.
    from tests.integration.test_compaction import BROKER, create, produce

    broker = ottla_broker_factory(BROKER, env={"OTTLA_FAILPOINTS": "fsync.eio@.cleaned"})
    create(broker.bootstrap, "compacted")
    produce(broker.bootstrap, "compacted", ((b"k%d" % (i % 50), b"v" * 200) for i in range(3000)))

    deadline = time.monotonic() + 120
    while broker.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not broker.running() and broker.process.returncode == 1, broker.read_stderr()[-2000:]
    lines = [line for line in broker.read_stderr().splitlines() if "log directory offline" in line]
    assert len(lines) == 1 and ".cleaned" in lines[0] and "Input/output error" in lines[0], lines


def test_eio_on_a_leader_epoch_checkpoint_fsync_halts_the_broker_like_any_other(ottla_broker_factory):
    # A new leader's epoch entry is written by the disk worker after it leads: its fsync failing
    # there must take the log directory offline, not end one worker job and go on.
    broker = ottla_broker_factory(env={"OTTLA_FAILPOINTS": "fsync.eio@led-0/leader-epoch-checkpoint"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("led", 1, 1)]).values():
        future.result(60)

    deadline = time.monotonic() + 60
    while broker.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not broker.running() and broker.process.returncode == 1, broker.read_stderr()[-2000:]
    lines = [line for line in broker.read_stderr().splitlines() if "log directory offline" in line]
    assert len(lines) == 1 and "led-0/leader-epoch-checkpoint" in lines[0] and "Input/output error" in lines[0], lines
