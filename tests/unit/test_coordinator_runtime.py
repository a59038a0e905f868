"""Coordinators follow partition leadership through the runtime: a broker that stops leading
a `__consumer_offsets` / `__transaction_state` partition unloads it (NOT_COORDINATOR), and
loads it again from the log when it leads it once more (a new leader epoch)."""

import asyncio
import contextlib
import threading
from datetime import timedelta

from ottla.config import BrokerConfig
from ottla.coordinator.group.api import OffsetCommit
from ottla.coordinator.group.records import OFFSETS_TOPIC
from ottla.coordinator.transaction.log_format import TRANSACTION_STATE_TOPIC
from ottla.errors import ErrorCode
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.metadata_cache import PartitionState
from tests.loop_turns import most_objects_between_turns, seen_between_turns
from tests.waiting import coordinators_loaded

E = ErrorCode
CONFIG = {"node.id": 1, "offsets.topic.num.partitions": 2, "transaction.state.log.num.partitions": 2}


def test_leadership_moves_load_and_unload_the_coordinators(tmp_path):
    async def scenario():
        broker = Broker(tmp_path, BrokerConfig(CONFIG), port=0)
        await broker.start()
        await coordinators_loaded(broker)
        try:
            groups, txns = broker.groups.coordinator, broker.transactions.coordinator
            committed = asyncio.get_running_loop().create_future()
            groups.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                                  offsets={("t", 0): OffsetCommit(5, -1, "")}, now_ms=now_ms(),
                                  on_complete=committed.set_result)
            assert await committed == {("t", 0): E.none}
            initialized = asyncio.get_running_loop().create_future()
            txns.init_producer_id("tx", 60_000, None, now_ms(), initialized.set_result)
            assert (await initialized).error == E.none

            def move(topic, partition, leader, epoch):
                return broker.replicas.apply_partition_states(
                    [PartitionState(topic, partition, leader, epoch, (1, 2), (1, 2))])

            g, t = groups.partition_for("g"), txns.partition_for("tx")
            assert move(OFFSETS_TOPIC, g, 2, 1) == {(OFFSETS_TOPIC, g): E.none}
            move(TRANSACTION_STATE_TOPIC, t, 2, 1)
            assert groups.fetch_offsets(group_id="g", partitions=None).error == E.not_coordinator
            assert txns.describe_transactions(["tx"])[0].error == E.not_coordinator
            refused = asyncio.get_running_loop().create_future()
            groups.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                                  offsets={("t", 0): OffsetCommit(9, -1, "")}, now_ms=now_ms(),
                                  on_complete=refused.set_result)
            assert await asyncio.wait_for(refused, timedelta(seconds=30).total_seconds()) == {
                ("t", 0): E.not_coordinator}

            move(OFFSETS_TOPIC, g, 1, 2)
            move(TRANSACTION_STATE_TOPIC, t, 1, 2)
            fetched = groups.fetch_offsets(group_id="g", partitions=None)
            while fetched.error == E.coordinator_load_in_progress:  # loads in steps, on the loop
                await asyncio.sleep(0.01)
                fetched = groups.fetch_offsets(group_id="g", partitions=None)
            assert fetched.error == E.none and fetched.offsets[("t", 0)].offset == 5
            described = txns.describe_transactions(["tx"])[0]
            while described.error == E.coordinator_load_in_progress:  # loads in steps too
                await asyncio.sleep(0.01)
                described = txns.describe_transactions(["tx"])[0]
            assert described.error == E.none and described.state == "Empty"
        finally:
            await broker.stop()

    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def _transactional_ids(tmp_path, count: int = 40):
    """A started broker with one `__transaction_state` partition and `count` transactional ids
    initialized: (broker, the ids, each one's producer id)."""
    broker = Broker(tmp_path, BrokerConfig({**CONFIG, "transaction.state.log.num.partitions": 1}), port=0)
    await broker.start()
    await coordinators_loaded(broker)
    try:
        ids, producers = [f"tx-{i}" for i in range(count)], {}
        for transactional_id in ids:
            initialized = asyncio.get_running_loop().create_future()
            broker.transactions.coordinator.init_producer_id(transactional_id, 60_000, None, now_ms(),
                                                             initialized.set_result)
            producers[transactional_id] = (await initialized).producer_id
        yield broker, ids, producers
    finally:
        await broker.stop()


def test_transaction_state_loads_in_steps_through_the_runtime(tmp_path):
    """A `__transaction_state` partition loads as `__consumer_offsets` does: record set by
    record set, the event loop running between them and its ids answering
    COORDINATOR_LOAD_IN_PROGRESS until the last; then every id is back as the log has it."""

    async def scenario():
        async with _transactional_ids(tmp_path) as (broker, ids, producers):
            txns = broker.transactions.coordinator
            broker.coordinator_runtime.load_chunk_bytes = 1024  # a few batches per step

            def move(leader, epoch):
                broker.replicas.apply_partition_states(
                    [PartitionState(TRANSACTION_STATE_TOPIC, 0, leader, epoch, (1, 2), (1, 2))])

            move(2, 1)
            move(1, 2)
            steps_seen = 0
            described = txns.describe_transactions(ids)
            while any(d.error == E.coordinator_load_in_progress for d in described):
                steps_seen += 1
                await asyncio.sleep(0)  # one turn of the loop: the load advances by one step
                described = txns.describe_transactions(ids)
            assert steps_seen >= 3
            assert [(d.error, d.state, d.producer_id) for d in described] == [
                (E.none, "Empty", producers[t]) for t in ids]

    asyncio.run(scenario())


def test_markers_are_answered_once_the_high_watermark_passes_them(tmp_path):
    from kio.schema.write_txn_markers.v1.request import (
        WritableTxnMarker,
        WritableTxnMarkerTopic,
        WriteTxnMarkersRequest,
    )

    from ottla.server.context import RequestContext
    from ottla.server.handlers import write_txn_markers

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig(CONFIG), port=0)
        await broker.start()
        try:
            broker.create_topic("t", 1, {})
            broker.replicas.apply_partition_states([PartitionState("t", 0, 1, 1, (1, 2), (1, 2))])
            request = WriteTxnMarkersRequest(markers=(WritableTxnMarker(
                producer_id=9, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
                topics=(WritableTxnMarkerTopic(name="t", partition_indexes=(0,)),)),))
            ctx = RequestContext(broker, write_txn_markers.API_KEY, 1, None, "test")
            answer = asyncio.ensure_future(write_txn_markers.write_markers(ctx, request))
            await asyncio.sleep(0.2)
            assert not answer.done()  # follower 2 of the ISR does not have the marker yet
            partition = broker.replicas.get_partition("t", 0)
            partition.update_follower_fetch(2, partition.log_end_offset, now_ms())
            broker.replicas.high_watermark_moved("t", 0)
            response = await asyncio.wait_for(answer, 30)
            assert response.markers[0].topics[0].partitions[0].error_code == E.none
        finally:
            await broker.stop()

    asyncio.run(scenario())


def _lead_again(broker, topic: str, partition: int) -> None:
    """Broker 2 leads the partition, then this broker (1) again: its coordinator loads it anew."""
    for leader, epoch in ((2, 1), (1, 2)):
        broker.replicas.apply_partition_states([PartitionState(topic, partition, leader, epoch, (1, 2), (1, 2))])


@contextlib.asynccontextmanager
async def _committed_offsets(tmp_path, count: int = 3000):
    """A started broker where group "g" committed offsets of `count` partitions in one
    OffsetCommit: (broker, its group coordinator, the group's partition, the offsets)."""
    broker = Broker(tmp_path, BrokerConfig(CONFIG), port=0)
    await broker.start()
    try:
        groups = broker.groups.coordinator
        offsets = {("t", p): OffsetCommit(p + 1, -1, "") for p in range(count)}
        committed = asyncio.get_running_loop().create_future()
        groups.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                              offsets=offsets, now_ms=now_ms(), on_complete=committed.set_result)
        assert set((await committed).values()) == {E.none}
        yield broker, groups, groups.partition_for("g"), offsets
    finally:
        await broker.stop()


def test_a_long_partition_loads_in_steps_that_let_the_loop_run(tmp_path):
    """3,000 offset records: after one turn of the event loop the partition is still loading
    (the broker keeps serving meanwhile), and it ends with every offset back."""
    async def scenario():
        async with _committed_offsets(tmp_path) as (broker, groups, g, offsets):
            _lead_again(broker, OFFSETS_TOPIC, g)
            await asyncio.sleep(0)
            assert groups.fetch_offsets(group_id="g", partitions=None).error == E.coordinator_load_in_progress
            fetched = groups.fetch_offsets(group_id="g", partitions=None)
            while fetched.error == E.coordinator_load_in_progress:
                await asyncio.sleep(0.01)
                fetched = groups.fetch_offsets(group_id="g", partitions=None)
            assert fetched.error == E.none and {tp: o.offset for tp, o in fetched.offsets.items()} == {
                tp: o.offset for tp, o in offsets.items()}

    asyncio.run(scenario())


def test_a_commit_too_large_for_one_batch_is_refused_as_kafka_does(tmp_path):
    """Kafka checks max.message.bytes on the coordinators' appends too: a commit whose batch
    would exceed it is answered INVALID_COMMIT_OFFSET_SIZE for every partition, nothing of it
    is kept, and a commit that fits goes through. (Ottla appended it whatever its size.)"""

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({**CONFIG, "message.max.bytes": 2048}), port=0)
        await broker.start()
        await coordinators_loaded(broker)
        try:
            groups, loop = broker.groups.coordinator, asyncio.get_running_loop()

            def commit(partitions):
                done = loop.create_future()
                groups.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                                      offsets={("t", p): OffsetCommit(7, -1, "") for p in partitions},
                                      now_ms=now_ms(), on_complete=done.set_result)
                return asyncio.wait_for(done, 30)

            too_many = range(100)  # about 50 bytes a record: 5,000 bytes
            assert await commit(too_many) == dict.fromkeys((("t", p) for p in too_many), E.invalid_commit_offset_size)
            assert groups.fetch_offsets(group_id="g", partitions=None).offsets == {}
            assert await commit(range(3)) == dict.fromkeys((("t", p) for p in range(3)), E.none)
            assert sorted(groups.fetch_offsets(group_id="g", partitions=None).offsets) == [("t", p) for p in range(3)]
        finally:
            await broker.stop()

    asyncio.run(scenario())


class _HeldDecoding:
    """Wraps `owner.name` (a decoding step of a load): its first call notes "decoding", wakes
    the other client on the loop and, off the loop's thread, waits for that client's answer
    (on the loop's thread nothing else could run meanwhile: it goes on at once)."""

    def __init__(self, monkeypatch, owner, name: str, events: list[str]):
        self.events, loop = events, asyncio.get_running_loop()
        self.started, self.answered = asyncio.Event(), threading.Event()
        original = getattr(owner, name)

        def observed(*args):
            if not events:
                events.append("decoding")
                loop.call_soon_threadsafe(self.started.set)
                if threading.current_thread() is not threading.main_thread():
                    self.answered.wait(60)
            return original(*args)

        monkeypatch.setattr(owner, name, observed)

    async def other_client(self, name: str, request) -> None:
        await self.started.wait()
        self.events.append(f"{name} answered {request().name}")
        self.answered.set()


def test_a_load_decodes_off_the_loop_while_requests_are_answered(tmp_path, monkeypatch):
    """The survivors of a `__consumer_offsets` partition are decoded (100,000 offsets: 1.1 s of
    CPU) while the loop answers other requests: the group's own OffsetFetch in the meantime
    gets COORDINATOR_LOAD_IN_PROGRESS, and then every offset is back."""
    from ottla.coordinator.group import loading

    events: list[str] = []

    async def scenario():
        async with _committed_offsets(tmp_path) as (broker, groups, g, offsets):
            held = _HeldDecoding(monkeypatch, loading.PartitionLoader, "_decode", events)
            other = asyncio.ensure_future(held.other_client(
                "OffsetFetch", lambda: groups.fetch_offsets(group_id="g", partitions=None).error))
            _lead_again(broker, OFFSETS_TOPIC, g)
            fetched = groups.fetch_offsets(group_id="g", partitions=None)
            while fetched.error == E.coordinator_load_in_progress:
                await asyncio.sleep(0.01)
                fetched = groups.fetch_offsets(group_id="g", partitions=None)
            events.append("loaded")
            await other
            return fetched

    fetched = asyncio.run(scenario())
    assert events == ["decoding", "OffsetFetch answered coordinator_load_in_progress", "loaded"]
    assert fetched.error == E.none and {tp: o.offset for tp, o in fetched.offsets.items()} == {
        ("t", p): p + 1 for p in range(3000)}


def test_transaction_state_decodes_off_the_loop_while_requests_are_answered(tmp_path, monkeypatch):
    """The same for `__transaction_state` (100,000 ids: 1.9 s of CPU on the loop): its ids
    answer COORDINATOR_LOAD_IN_PROGRESS while the load decodes, then each is back."""
    from ottla.coordinator.transaction import log_format

    events: list[str] = []

    async def scenario():
        async with _transactional_ids(tmp_path) as (broker, ids, producers):
            txns = broker.transactions.coordinator
            held = _HeldDecoding(monkeypatch, log_format, "decode_value", events)
            other = asyncio.ensure_future(held.other_client(
                "DescribeTransactions", lambda: txns.describe_transactions(ids[:1])[0].error))
            _lead_again(broker, TRANSACTION_STATE_TOPIC, 0)
            described = txns.describe_transactions(ids)
            while any(d.error == E.coordinator_load_in_progress for d in described):
                await asyncio.sleep(0.01)
                described = txns.describe_transactions(ids)
            events.append("loaded")
            await other
            return [(d.error, d.state, d.producer_id) for d in described], producers

    described, producers = asyncio.run(scenario())
    assert events == ["decoding", "DescribeTransactions answered coordinator_load_in_progress", "loaded"]
    assert described == [(E.none, "Empty", producers[f"tx-{i}"]) for i in range(40)]


def test_many_groups_are_built_while_the_loop_turns_and_served_once_all_are_in(tmp_path, monkeypatch):
    """20,000 separate groups of one offset each in one partition: the loop built them all in
    one step of the load; now the load's thread builds them while the loop turns (the most
    made between two turns: what one slice of the thread builds), and the loop only merges
    them in. OffsetFetch answers COORDINATOR_LOAD_IN_PROGRESS at every turn until then, and
    then each group's offset."""
    from ottla.coordinator.group.group import Group

    count, made = 20_000, [0]
    build = Group.__init__

    def counted(self, *args, **kwargs):
        made[0] += 1
        build(self, *args, **kwargs)

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({**CONFIG, "offsets.topic.num.partitions": 1}), port=0)
        await broker.start()
        await coordinators_loaded(broker)
        try:
            groups = broker.groups.coordinator
            for first in range(0, count, 1000):
                answers = []
                for i in range(first, first + 1000):
                    answers.append(asyncio.get_running_loop().create_future())
                    groups.commit_offsets(group_id=f"g-{i}", member_id="", group_instance_id=None,
                                          generation_id=-1, offsets={("t", 0): OffsetCommit(i, -1, "")},
                                          now_ms=now_ms(), on_complete=answers[-1].set_result)
                assert [await a for a in answers] == [{("t", 0): E.none}] * 1000
            monkeypatch.setattr(Group, "__init__", counted)
            _lead_again(broker, OFFSETS_TOPIC, 0)

            async def loaded():
                while groups.fetch_offsets(group_id="g-0", partitions=None).error == E.coordinator_load_in_progress:
                    await asyncio.sleep(0)

            seen, _ = await seen_between_turns(loaded(), lambda: (
                groups.fetch_offsets(group_id=f"g-{count - 1}", partitions=None).error, made[0]))
            fetched = [groups.fetch_offsets(group_id=f"g-{i}", partitions=None) for i in range(count)]
            return seen, [(f.error, {tp: o.offset for tp, o in f.offsets.items()}) for f in fetched]
        finally:
            await broker.stop()

    seen, fetched = asyncio.run(scenario())
    errors = [error for error, _ in seen]
    served = errors.index(E.none)
    assert served > 0 and set(errors[:served]) == {E.coordinator_load_in_progress} and set(errors[served:]) == {E.none}
    assert seen[-1][1] == count
    assert most_objects_between_turns([built for _, built in seen]) < count // 2
    assert fetched == [(E.none, {("t", 0): i}) for i in range(count)]
