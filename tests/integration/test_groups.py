"""Consumer groups with real clients against a real broker process."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import threading
import time

import aiokafka
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KPTopicPartition

FAST_GROUPS = {"group.initial.rebalance.delay.ms": 500}


def _create_and_fill(bootstrap, topic, partitions, per_partition):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0
    return admin


def _group_member(bootstrap, group, topic, events, stop, crash):
    """One consumer process: reports its assignments and what it consumed, commits as it goes.
    On `crash` it vanishes without leaving the group, as a killed consumer would."""
    name = multiprocessing.current_process().name
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
    })

    def on_assign(_, partitions):
        events.put(("assigned", name, sorted(p.partition for p in partitions)))

    consumer.subscribe([topic], on_assign=on_assign)
    while not stop.is_set():
        if crash.is_set():
            events.close()
            events.join_thread()
            os._exit(1)
        messages = consumer.consume(100, 0.2)
        consumed = [(m.partition(), m.offset()) for m in messages if m.error() is None]
        if consumed:
            consumer.commit(asynchronous=False)
            events.put(("consumed", name, consumed))
    consumer.close()


def _wait_for(events, assignment, consumed, done, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        try:
            kind, name, payload = events.get(timeout=1)
        except queue.Empty:
            continue
        if kind == "assigned":
            assignment[name] = payload
        else:
            consumed.update(payload)


def test_three_consumer_processes_share_six_partitions(ottla_broker_factory):
    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 3000})
    topic, group, per_partition = "shared", "trio", 50
    admin = _create_and_fill(broker.bootstrap, topic, 6, per_partition)
    context = multiprocessing.get_context("spawn")
    events, stop = context.Queue(), context.Event()
    crashes = [context.Event() for _ in range(3)]
    workers = [context.Process(target=_group_member, args=(broker.bootstrap, group, topic, events, stop, crash),
                               name=f"member-{i}") for i, crash in enumerate(crashes)]
    for worker in workers:
        worker.start()
    assignment: dict[str, list[int]] = {}
    consumed: set[tuple[int, int]] = set()
    try:
        _wait_for(events, assignment, consumed, lambda: len(consumed) == 6 * per_partition and len(assignment) == 3
                  and all(len(p) == 2 for p in assignment.values()))
        owned = sorted(p for partitions in assignment.values() for p in partitions)
        assert owned == list(range(6)), assignment  # every partition once, none twice
        assert consumed == {(p, o) for p in range(6) for o in range(per_partition)}
        description = admin.describe_consumer_groups([group])[group].result(15)
        assert description.state.name == "STABLE" and len(description.members) == 3
        described = sorted(tp.partition for m in description.members for tp in m.assignment.topic_partitions)
        assert described == list(range(6))
        committed = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group}).committed(
            [TopicPartition(topic, p) for p in range(6)], timeout=15)
        assert [tp.offset for tp in committed] == [per_partition] * 6

        # One member dies without a word: after its session times out the other two take over.
        crashes[2].set()
        workers[2].join(30)
        del assignment["member-2"]
        _wait_for(events, assignment, consumed, lambda: sorted(len(p) for p in assignment.values()) == [3, 3])
        assert sorted(p for partitions in assignment.values() for p in partitions) == list(range(6))
        description = admin.describe_consumer_groups([group])[group].result(15)
        assert description.state.name == "STABLE" and len(description.members) == 2
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()


def _consume(bootstrap, group, topic, count, **extra):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **extra})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.consume(count - len(got), 0.5):
            assert message.error() is None, message.error()
            got.append(message)
    return consumer, got


def _committed(bootstrap, group, topic, partitions):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                       timeout=15)]
    finally:
        consumer.close()


def test_committed_offsets_survive_consumer_and_broker_restarts(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic, group = "durable", "keeper"
    _create_and_fill(broker.bootstrap, topic, 2, 100)
    consumer, got = _consume(broker.bootstrap, group, topic, 120)
    consumer.commit(asynchronous=False)
    positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
    consumer.close()
    assert sum(positions.values()) == 120
    assert _committed(broker.bootstrap, group, topic, 2) == [positions[0], positions[1]]

    # A new consumer in the group resumes where the last one committed.
    consumer, rest = _consume(broker.bootstrap, group, topic, 80)
    assert {(m.partition(), m.offset()) for m in got}.isdisjoint({(m.partition(), m.offset()) for m in rest})
    consumer.close()

    broker.restart()
    assert _committed(broker.bootstrap, group, topic, 2) == [positions[0], positions[1]]
    broker.restart(crash=True)  # acknowledged commits were fsynced
    assert _committed(broker.bootstrap, group, topic, 2) == [positions[0], positions[1]]
    consumer, again = _consume(broker.bootstrap, group, topic, 80)
    assert sorted((m.partition(), m.offset()) for m in again) == sorted((m.partition(), m.offset()) for m in rest)
    consumer.close()


def test_kafka_python_consumer_group(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic, group = "kp", "kp-group"
    _create_and_fill(broker.bootstrap, topic, 3, 20)
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=15000)
    seen = []
    for message in consumer:
        seen.append((message.partition, message.offset))
        if len(seen) == 60:
            break
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(20)]
    assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1, 2]
    consumer.commit()
    assert consumer.committed(KPTopicPartition(topic, 1)) == 20
    consumer.close()
    assert _committed(broker.bootstrap, group, topic, 3) == [20, 20, 20]

    # Two kafka-python members split the partitions. Each polls in its own thread, as an
    # application would: a member's rejoin happens inside its poll.
    stop = threading.Event()
    assignments: dict[int, set[int]] = {}

    def member(index):
        consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id="pair",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        while not stop.is_set():
            consumer.poll(100)
            assignments[index] = {tp.partition for tp in consumer.assignment()}
        consumer.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    try:
        # Each member's share is read after its own poll. A second member that joins after the
        # initial rebalance delay (a slow start) makes a second rebalance, and for its last
        # moments the first member still shows all three partitions (eager revocation keeps
        # them until its own SyncGroup answer) while the second already shows its share: so
        # the test waits for the two to split the partitions, and fails if they never do.
        while True:
            a, b = assignments.get(0, set()), assignments.get(1, set())
            if a and b and a.isdisjoint(b) and a | b == {0, 1, 2}:
                break
            assert time.monotonic() < deadline, f"the members never split the partitions: {a}, {b}"
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def test_admin_lists_describes_and_deletes_groups(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic = "admin"
    admin = _create_and_fill(broker.bootstrap, topic, 2, 10)
    consumer, _ = _consume(broker.bootstrap, "busy", topic, 20, **{"client.id": "busy-client"})
    consumer.commit(asynchronous=False)

    idle, _ = _consume(broker.bootstrap, "idle", topic, 20)
    idle.commit(asynchronous=False)
    idle.close()

    listed = {g.group_id: g.state.name for g in admin.list_consumer_groups().result(15).valid}
    assert listed == {"busy": "STABLE", "idle": "EMPTY"}
    busy = admin.describe_consumer_groups(["busy"])["busy"].result(15)
    assert busy.partition_assignor == "range" and busy.members[0].client_id == "busy-client"
    assert busy.members[0].host.startswith("/127.0.0.1")

    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups(["busy"])["busy"].result(15)
    assert refused.value.args[0].name() == "NON_EMPTY_GROUP"
    admin.delete_consumer_groups(["idle"])["idle"].result(15)
    assert {g.group_id for g in admin.list_consumer_groups().result(15).valid} == {"busy"}
    assert _committed(broker.bootstrap, "idle", topic, 2) == [-1001, -1001]  # no committed offset
    consumer.close()


def test_static_member_restart_keeps_its_partitions_without_rebalance(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic, group = "static", "statics"
    admin = _create_and_fill(broker.bootstrap, topic, 4, 5)
    config = {"bootstrap.servers": broker.bootstrap, "group.id": group, "session.timeout.ms": 30000,
              "partition.assignment.strategy": "range"}
    rebalances_seen_by_a = []
    a = Consumer({**config, "group.instance.id": "a"})
    a.subscribe([topic], on_assign=lambda _, partitions: rebalances_seen_by_a.append(len(partitions)))
    b, _ = _consume(broker.bootstrap, group, topic, 0, **{"group.instance.id": "b", **config})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        a.poll(0.2)
        b.poll(0.2)
        if len(a.assignment()) == 2 and len(b.assignment()) == 2:
            break
    before = admin.describe_consumer_groups([group])[group].result(15)
    rebalances_before = len(rebalances_seen_by_a)
    b_partitions = sorted(tp.partition for tp in b.assignment())
    b.close()  # a static member's close does not leave the group
    b, _ = _consume(broker.bootstrap, group, topic, 0, **{"group.instance.id": "b", **config})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not b.assignment():
        b.poll(0.2)
        a.poll(0.2)
    after = admin.describe_consumer_groups([group])[group].result(15)
    assert sorted(tp.partition for tp in b.assignment()) == b_partitions
    assert after.state.name == "STABLE"
    ids_before = {m.group_instance_id: m.member_id for m in before.members}
    ids_after = {m.group_instance_id: m.member_id for m in after.members}
    assert ids_after["a"] == ids_before["a"] and ids_after["b"] != ids_before["b"]
    a.poll(1.0)
    assert len(rebalances_seen_by_a) == rebalances_before  # a was never asked to rejoin
    a.close()
    b.close()


def test_aiokafka_consumer_group(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic, group = "aio", "aio-group"
    _create_and_fill(broker.bootstrap, topic, 2, 15)

    async def run():
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                                             auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            seen = []
            async with asyncio.timeout(60):
                while len(seen) < 30:
                    batches = await consumer.getmany(timeout_ms=500)
                    seen.extend((m.partition, m.offset) for messages in batches.values() for m in messages)
            await consumer.commit()
            committed = [await consumer.committed(aiokafka.TopicPartition(topic, p)) for p in range(2)]
            return sorted(seen), committed
        finally:
            await consumer.stop()

    seen, committed = asyncio.run(run())
    assert seen == [(p, o) for p in range(2) for o in range(15)]
    assert committed == [15, 15]
    assert _committed(broker.bootstrap, group, topic, 2) == [15, 15]


def test_existing_offsets_topic_partition_count_wins_over_config(ottla_broker_factory):
    broker = ottla_broker_factory({**FAST_GROUPS, "offsets.topic.num.partitions": 3})
    topic, group = "moved", "sticky-home"
    _create_and_fill(broker.bootstrap, topic, 1, 10)
    consumer, _ = _consume(broker.bootstrap, group, topic, 10)
    consumer.commit(asynchronous=False)
    consumer.close()
    broker.stop()
    broker.config["offsets.topic.num.partitions"] = 7  # as if an operator changed it later
    broker.start()
    assert _committed(broker.bootstrap, group, topic, 1) == [10]


def test_offsets_committed_in_a_transaction(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    topic, group = "eos-in", "eos"
    admin = _create_and_fill(broker.bootstrap, topic, 1, 30)
    admin.create_topics([NewTopic("eos-out", 1, 1)])["eos-out"].result(15)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "eos-tx"})
    producer.init_transactions(30)
    consumer, got = _consume(broker.bootstrap, group, topic, 10, **{"isolation.level": "read_committed"})

    def send_offsets_and(finish, offset):
        producer.begin_transaction()
        producer.produce("eos-out", b"x")
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)],
                                             consumer.consumer_group_metadata(), 30)
        finish(30)

    send_offsets_and(producer.commit_transaction, 10)
    assert _committed(broker.bootstrap, group, topic, 1) == [10]
    send_offsets_and(producer.abort_transaction, 20)
    assert _committed(broker.bootstrap, group, topic, 1) == [10]  # aborted offsets never show
    consumer.close()
    broker.restart(crash=True)  # the markers in __consumer_offsets replay to the same answer
    assert _committed(broker.bootstrap, group, topic, 1) == [10]


def test_deleting_a_topic_deletes_its_committed_offsets(ottla_broker_factory):
    broker = ottla_broker_factory(FAST_GROUPS)
    admin = _create_and_fill(broker.bootstrap, "doomed", 1, 5)
    consumer, _ = _consume(broker.bootstrap, "reader", "doomed", 5)
    consumer.commit(asynchronous=False)
    consumer.close()
    assert _committed(broker.bootstrap, "reader", "doomed", 1) == [5]
    admin.delete_topics(["doomed"])["doomed"].result(15)
    admin.create_topics([NewTopic("doomed", 1, 1)])["doomed"].result(15)
    assert _committed(broker.bootstrap, "reader", "doomed", 1) == [-1001]  # a new topic starts afresh
