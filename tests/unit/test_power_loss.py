"""A power loss at many points of produce, roll, snapshot, transaction commit and group commit
(tests/powerloss.py cuts every file back to its last fsync): nothing acknowledged as durable is
lost and no transaction stays open. In process: real brokers on real files, no sockets."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from kio.index import load_request_schema
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.protocol.build import make, nested
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.context import RequestContext
from ottla.server.handlers import (
    add_partitions_to_txn,
    describe_transactions,
    end_txn,
    init_producer_id,
    offset_commit,
    offset_fetch,
)
from powerloss import PowerLoss
from tests.waiting import coordinators_loaded

E = ErrorCode
CONFIG = {"offsets.topic.num.partitions": 1, "transaction.state.log.num.partitions": 1,
          "log.index.size.max.bytes": 4096}  # small images (power loss at every sync)


async def start(data_dir) -> Broker:
    broker = Broker(data_dir, BrokerConfig(CONFIG))
    await broker.groups.start()
    await broker.transactions.start()
    await coordinators_loaded(broker)
    return broker


async def call(broker, module, version, request):
    return await asyncio.wait_for(module.handle(RequestContext(broker, module.API_KEY, version, None, "t"), request), 30)


async def committed_txn(broker, tid: str, value: bytes) -> None:
    """A transactional producer's whole life: init, add t-0, produce, commit; returns once the
    coordinator says CompleteCommit (what a client's commit_transaction waits for and more)."""
    init = await call(broker, init_producer_id, 4, InitProducerIdRequest(
        transactional_id=tid, transaction_timeout=timedelta(seconds=60)))
    pid, epoch = init.producer_id, init.producer_epoch
    await call(broker, add_partitions_to_txn, 3, AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(AddPartitionsToTxnTopic(name="t", partitions=(0,)),)))
    broker.replicas.append("t", 0, build_batch([Record(b"k", value, (), now_ms())], producer_id=pid, producer_epoch=epoch,
                                      base_sequence=0, is_transactional=True), now_ms=now_ms())
    broker.logs.get_log("t", 0).flush()  # the data is durable (a flush.ms tick, a roll): only the marker is at stake
    assert (await call(broker, end_txn, 3, EndTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True))).error_code is E.none
    for _ in range(500):
        (state,) = (await call(broker, describe_transactions, 0, DescribeTransactionsRequest(
            transactional_ids=(tid,)))).transaction_states
        if state.transaction_state == "CompleteCommit":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{tid} never completed")


async def commit_offset(broker, group: str, offset: int) -> ErrorCode:
    schema = load_request_schema(offset_commit.API_KEY, 8)
    topic_type, partition_type = nested(schema, "OffsetCommitRequestTopic"), nested(schema, "OffsetCommitRequestPartition")
    response = await call(broker, offset_commit, 8, make(
        schema, group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        retention_time=timedelta(milliseconds=-1), topics=(make(topic_type, name="t", partitions=(make(
            partition_type, partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
            commit_timestamp=-1, committed_metadata=""),)),)))
    return response.topics[0].partitions[0].error_code


async def fetched_offset(broker, group: str) -> int:
    schema = load_request_schema(offset_fetch.API_KEY, 7)
    topic_type = nested(schema, "OffsetFetchRequestTopic")
    response = await call(broker, offset_fetch, 7, make(
        schema, group_id=group, topics=(make(topic_type, name="t", partition_indexes=(0,)),), require_stable=False))
    return response.topics[0].partitions[0].committed_offset


def life(data_dir, scenario) -> None:
    """One run of the broker that ends in a crash: no clean shutdown, the lock released as a
    dying process releases it; pending tasks are cancelled by asyncio.run."""
    async def run():
        broker = await start(data_dir)
        try:
            await scenario(broker)
        finally:
            broker.release_data_dir()
    asyncio.run(run())


@pytest.mark.parametrize("transactions", [1, 2, 5])
def test_a_committed_transaction_is_never_left_open_by_a_power_loss(tmp_path, transactions):
    async def first(broker):
        broker.create_topic("t", 1, {})
        for i in range(transactions):
            await committed_txn(broker, f"tx{i}", b"v%d" % i)

    with PowerLoss(tmp_path) as power:
        life(tmp_path, first)
        power.crash()

        async def second(broker):
            for _ in range(300):  # a PrepareCommit without Complete is rolled forward by the coordinator
                log = broker.logs.get_log("t", 0)
                if log.last_stable_offset == log.log_end_offset:
                    break
                await asyncio.sleep(0.01)
            log = broker.logs.get_log("t", 0)
            assert log.log_end_offset == 2 * transactions  # every data batch and every COMMIT marker
            assert log.last_stable_offset == log.log_end_offset, "a transaction stayed open"
            for i in range(transactions):
                (state,) = (await call(broker, describe_transactions, 0, DescribeTransactionsRequest(
                    transactional_ids=(f"tx{i}",)))).transaction_states
                assert state.transaction_state == "CompleteCommit"
        life(tmp_path, second)


@pytest.mark.parametrize("commits", [1, 3, 20])
def test_acknowledged_offset_commits_survive_a_power_loss(tmp_path, commits):
    async def first(broker):
        broker.create_topic("t", 1, {})
        for i in range(commits):
            assert await commit_offset(broker, "g", 10 + i) is E.none
        broker.replicas.append("t", 0, build_batch([Record(b"k", b"unsynced", (), now_ms())]), now_ms=now_ms())

    with PowerLoss(tmp_path) as power:
        life(tmp_path, first)
        lost = power.crash()
        assert "t-0/00000000000000000000.log" in lost  # the layer does throw unsynced data away

        async def second(broker):
            assert await fetched_offset(broker, "g") == 10 + commits - 1
        life(tmp_path, second)


def _idempotent_appends_across_rolls(broker):
    broker.create_topic("t", 1, {"segment.bytes": 600})
    for seq in range(40):
        broker.replicas.append("t", 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                          producer_epoch=0, base_sequence=seq), now_ms=now_ms())


def test_rolls_and_snapshots_keep_every_flushed_batch(tmp_path):
    """Idempotent produce across many rolls (each roll queues the fsync of the old segment
    and of its producer snapshot in the disk worker, as Kafka's roll schedules its flush);
    after a power loss every batch below the last roll is there and the producer's next
    sequence is still accepted, its duplicates still recognised."""
    async def first(broker):
        _idempotent_appends_across_rolls(broker)
        broker.logs.disk_worker.drain()  # the queued fsyncs ran

    with PowerLoss(tmp_path) as power:
        life(tmp_path, first)
        power.crash()

        async def second(broker):
            log = broker.logs.get_log("t", 0)
            rolled_to = log.segments[-1].base_offset
            assert rolled_to > 30 and log.log_end_offset >= rolled_to
            _continues_the_idempotent_producer(broker)
        life(tmp_path, second)


def test_a_power_loss_before_the_rolls_fsyncs_ran_recovers_a_consistent_log(tmp_path):
    """The same, but the power goes before the disk worker got to any roll's fsync: the
    recovery point never moved past them, so recovery scans those segments, keeps what
    reached the disk, and the producer's state matches the log that is left."""
    held = threading.Event()

    async def first(broker):
        broker.logs.disk_worker.submit("holding the worker", lambda: held.wait(60))
        _idempotent_appends_across_rolls(broker)
        assert broker.logs.get_log("t", 0).recovery_point == 0
        broker.logs.checkpoint(inline=True)  # a checkpoint now must not claim the rolls durable

    with PowerLoss(tmp_path) as power:
        life(tmp_path, first)
        lost = power.crash()
        held.set()
        assert any(name.startswith("t-0/") for name in lost)  # rolled segments were cut back

        async def second(broker):
            log = broker.logs.get_log("t", 0)
            end = log.log_end_offset  # nothing was fsynced: every segment came back empty
            assert log.read(0, 1 << 20, max_offset=end).records == b""
            # and the torn snapshots were skipped: the producer starts over, not out of order
            nxt = broker.replicas.append("t", 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                                    producer_epoch=0, base_sequence=0), now_ms=now_ms())
            assert nxt.base_offset == end and not nxt.duplicate
        life(tmp_path, second)


def _continues_the_idempotent_producer(broker, topic="t"):
    end = broker.logs.get_log(topic, 0).log_end_offset
    duplicate = broker.replicas.append(topic, 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                                  producer_epoch=0, base_sequence=end - 1), now_ms=now_ms())
    assert duplicate.duplicate and duplicate.base_offset == end - 1
    nxt = broker.replicas.append(topic, 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                              producer_epoch=0, base_sequence=end), now_ms=now_ms())
    assert nxt.base_offset == end


def test_a_power_loss_at_every_sync_of_a_run_loses_nothing_acknowledged(tmp_path):
    """The run above, cut at each of its fsyncs (each sync's image is what a power loss at that
    moment leaves): transactions committed, offsets committed, idempotent appends across rolls
    and their snapshots. From every image, a restart finds everything acknowledged by then,
    and no transaction stays open once the coordinator has rolled its prepared ones forward."""
    data_dir = tmp_path / "data"
    acked: list[tuple[str, object]] = []

    async def run(broker):
        broker.create_topic("t", 1, {})
        broker.create_topic("u", 1, {"segment.bytes": 600})
        for i in range(2):
            await committed_txn(broker, f"tx{i}", b"v%d" % i)
            acked.append(("txn", f"tx{i}"))
            assert await commit_offset(broker, "g", 10 + i) is E.none
            acked.append(("offset", 10 + i))
        for seq in range(24):
            broker.replicas.append("u", 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                              producer_epoch=0, base_sequence=seq), now_ms=now_ms())
        await asyncio.to_thread(broker.logs.disk_worker.drain)  # the rolls' fsyncs ran
        acked.append(("data", broker.logs.get_log("u", 0).segments[-1].base_offset))
        assert await commit_offset(broker, "g", 12) is E.none
        acked.append(("offset", 12))

    with PowerLoss(data_dir) as power:
        power.images_at_every_sync(tmp_path / "images", lambda: list(acked))
        life(data_dir, run)
    # Many points, the later ones after acknowledgements of every kind.
    assert len(power.images) > 20 and {kind for kind, _ in power.images[-1][1]} == {"txn", "offset", "data"}

    async def check(broker, noted):
        transactions = [value for kind, value in noted if kind == "txn"]
        for _ in range(300):  # prepared commits are rolled forward (their markers written again)
            states = {tid: (await call(broker, describe_transactions, 0, DescribeTransactionsRequest(
                transactional_ids=(tid,)))).transaction_states[0].transaction_state for tid in ("tx0", "tx1")}
            if not any(state.startswith("Prepare") for state in states.values()):
                break
            await asyncio.sleep(0.01)
        assert all(states[tid] == "CompleteCommit" for tid in transactions), states
        if ("t", 0) in broker.logs.logs:
            log = broker.logs.get_log("t", 0)
            if "Ongoing" not in states.values():
                assert log.last_stable_offset == log.log_end_offset, (states, "a transaction stayed open")
            assert log.log_end_offset >= 2 * len(transactions)
        else:
            assert not noted
        offsets = [value for kind, value in noted if kind == "offset"]
        if offsets:
            assert await fetched_offset(broker, "g") >= offsets[-1]
        durable = [value for kind, value in noted if kind == "data"]
        if durable:
            assert broker.logs.get_log("u", 0).log_end_offset >= durable[0]
            _continues_the_idempotent_producer(broker, "u")

    for image, noted in power.images:
        life(image, lambda broker: check(broker, noted))
