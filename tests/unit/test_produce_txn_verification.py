"""KIP-890 as the Produce handler applies it, in a real broker in process (no sockets): which
transactional writes ask the coordinator, and what a refusal is answered with (Kafka's
`UnifiedLog.maybeStartTransactionVerification` and `ReplicaManager.appendRecords`)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest
from ottla.errors import ErrorCode
from ottla.protocol.build import make, nested
from ottla.protocol.schemas import request_schema
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch
from ottla.server.clock import now_ms
from ottla.server.handlers import produce
from tests.unit.test_txn_service import Node, run
from tests.waiting import coordinators_loaded

E = ErrorCode


class CountingNode(Node):
    """A broker whose coordinator counts the questions Produce asks it (verify under
    transactions version 1, add under version 2) and can hold the markers of an EndTxn."""

    def __init__(self, data_dir, config):
        super().__init__(data_dir, itertools.count(7), config)
        self.asks = 0
        self.before_ask = None
        coordinator = self.broker.transactions.coordinator
        for name in ("verify_partitions", "add_partitions"):
            setattr(coordinator, name, self._counted(getattr(coordinator, name)))
        self.held = []
        markers = self.broker.transactions.markers
        self.write_markers = markers.write_markers
        markers.write_markers = lambda *args: self.held.append(args)

    def release_markers(self):
        held, self.held = self.held, []
        for args in held:
            self.write_markers(*args)

    def _counted(self, method):
        def counted(*args, **kwargs):
            self.asks += 1
            if self.before_ask is not None:
                self.before_ask()
            return method(*args, **kwargs)
        return counted

    async def send(self, version, pid, epoch, seq, *partitions, tid="tx"):
        """Produce `version`, one transactional batch per partition (`seq`: its base sequence, or one
        per partition); {partition: (error, message)}."""
        request_type = request_schema(0, version)
        topic_type = nested(request_type, "TopicProduceData")
        partition_type = nested(request_type, "PartitionProduceData")
        topics = {}
        for topic, index in partitions:
            batch = build_batch([Record(None, b"v", ())], producer_id=pid, producer_epoch=epoch,
                                base_sequence=seq[(topic, index)] if isinstance(seq, dict) else seq,
                                is_transactional=True)
            topics.setdefault(topic, []).append(make(partition_type, index=index, records=batch))
        response = await self.call(produce, version, make(
            request_type, transactional_id=tid, acks=-1, timeout=timedelta(seconds=5),
            topic_data=tuple(make(topic_type, name=t, partition_data=tuple(p)) for t, p in topics.items())))
        return {(t.name, p.index): (p.error_code, p.error_message)
                for t in response.responses for p in t.partition_responses}


async def _started(tmp_path, config=None) -> CountingNode:
    node = CountingNode(tmp_path, {"add.partitions.to.txn.retry.backoff.max.ms": 0, **(config or {})})
    await node.broker.transactions.start()
    await coordinators_loaded(node.broker)
    node.broker.create_topic("t", 2, {})
    return node


def test_transactions_version_1_asks_only_for_the_first_write_to_a_partition(tmp_path):
    async def scenario():
        node = await _started(tmp_path)
        init = await node.init()
        pid, epoch = init.producer_id, init.producer_epoch
        assert await node.add(pid, epoch, [("t", 0)]) == {("t", 0): E.none}
        node.asks = 0
        assert await node.send(11, pid, epoch, 0, ("t", 0)) == {("t", 0): (E.none, None)}
        assert node.asks == 1
        for seq in (1, 2, 3):
            assert await node.send(11, pid, epoch, seq, ("t", 0)) == {("t", 0): (E.none, None)}
        assert node.asks == 1               # the log holds the transaction: nobody asked
        # A write of another epoch is not covered by it: the coordinator answers (fenced).
        assert (await node.send(11, pid, epoch + 1, 0, ("t", 0)))[("t", 0)][0] is not E.none
        assert node.asks == 2
    run(scenario())


def test_transactions_version_2_adds_a_partition_once(tmp_path):
    async def scenario():
        node = await _started(tmp_path)
        init = await node.init(version=5)
        pid, epoch = init.producer_id, init.producer_epoch
        node.asks = 0
        for seq in range(4):
            assert await node.send(12, pid, epoch, seq, ("t", 0)) == {("t", 0): (E.none, None)}
        assert node.asks == 1
        assert await node.send(12, pid, epoch, 0, ("t", 1)) == {("t", 1): (E.none, None)}
        assert node.asks == 2               # a partition new to the transaction is added
    run(scenario())


def test_a_write_whose_transaction_ended_while_the_request_waited_is_refused(tmp_path):
    """t-0 holds the transaction, t-1 does not: while the coordinator is asked about t-1, the
    transaction's marker lands in t-0 (as WriteTxnMarkers would). t-0's batch must not open a
    transaction nobody ends: it is refused, as Kafka's append refuses an unverified batch."""
    async def scenario():
        node = await _started(tmp_path)
        init = await node.init()
        pid, epoch = init.producer_id, init.producer_epoch
        assert await node.add(pid, epoch, [("t", 0), ("t", 1)]) == {("t", 0): E.none, ("t", 1): E.none}
        assert await node.send(11, pid, epoch, 0, ("t", 0)) == {("t", 0): (E.none, None)}
        log = node.broker.logs.get_log("t", 0)
        end = log.log_end_offset

        def marker_lands():
            node.before_ask = None
            node.broker.replicas.append("t", 0, build_control_batch(pid, epoch, 0, False, now_ms()),
                                        now_ms=now_ms(), origin="coordinator")
        node.before_ask = marker_lands
        answers = await node.send(11, pid, epoch, {("t", 0): 1, ("t", 1): 0}, ("t", 0), ("t", 1))
        assert answers[("t", 0)][0] is E.invalid_txn_state
        assert answers[("t", 1)] == (E.none, None)
        assert log.log_end_offset == end + 1            # the marker only
        assert log.producer_state.entry(pid).txn_first_offset is None
    run(scenario())


def test_a_verified_write_whose_transaction_ended_before_the_append_is_refused(tmp_path):
    """The coordinator answers for t-1 as the transaction stood when it was asked; the
    transaction's marker reaches t-1 before the write does. Kafka's VerificationGuard voids the
    verdict: the write is refused, not appended as a transaction nobody will end."""
    async def scenario():
        node = await _started(tmp_path)
        init = await node.init()
        pid, epoch = init.producer_id, init.producer_epoch
        assert await node.add(pid, epoch, [("t", 1)]) == {("t", 1): E.none}
        log = node.broker.logs.get_log("t", 1)

        def marker_lands():
            node.before_ask = None
            node.broker.replicas.append("t", 1, build_control_batch(pid, epoch, 0, False, now_ms()),
                                        now_ms=now_ms(), origin="coordinator")
        node.before_ask = marker_lands
        assert (await node.send(11, pid, epoch, 0, ("t", 1)))[("t", 1)][0] is E.invalid_txn_state
        assert log.log_end_offset == 1                  # the marker only
        assert log.producer_state.entry(pid).txn_first_offset is None
    run(scenario())


def test_a_version_2_write_waits_out_the_markers_of_the_previous_transaction(tmp_path):
    """The previous transaction's markers (at the bumped epoch) land while the write waits for
    them: they leave the coordinator's verdict standing, and the write opens the next
    transaction."""
    async def scenario():
        node = await _started(tmp_path, {"add.partitions.to.txn.retry.backoff.ms": 1,
                                         "add.partitions.to.txn.retry.backoff.max.ms": 600_000})
        init = await node.init(version=5)
        pid, epoch = init.producer_id, init.producer_epoch
        assert await node.send(12, pid, epoch, 0, ("t", 0)) == {("t", 0): (E.none, None)}
        assert await node.end(pid, epoch, commit=True, version=5) is E.none and node.held
        node.asks = 0
        waiting = asyncio.ensure_future(node.send(12, pid, epoch + 1, 0, ("t", 0)))
        while node.asks < 2:                            # refused CONCURRENT_TRANSACTIONS, asked again
            await asyncio.sleep(0.005)
        node.release_markers()
        assert await waiting == {("t", 0): (E.none, None)}
        entry = node.broker.logs.get_log("t", 0).producer_state.entry(pid)
        assert (entry.epoch, entry.txn_first_offset) == (epoch + 1, 2)   # data, marker, data
    run(scenario())


@pytest.mark.parametrize("version,expected", [
    # Transactions version 1 (Produce v11): the client cannot wait out the markers itself.
    (11, (E.not_enough_replicas, "Unable to verify the partition has been added to the transaction. "
                                 "Underlying error: CONCURRENT_TRANSACTIONS")),
    # Version 2: the client retries CONCURRENT_TRANSACTIONS; Kafka leaves it as it is.
    (12, (E.concurrent_transactions, None)),
])
def test_concurrent_transactions_from_the_coordinator_as_each_version_answers_it(tmp_path, version, expected):
    """The previous transaction's markers are still being written when a write to a partition it
    did not touch arrives: KIP-890 part 1 answers older clients NOT_ENOUGH_REPLICAS."""
    async def scenario():
        node = await _started(tmp_path)
        init = await node.init(version=5)
        pid, epoch = init.producer_id, init.producer_epoch
        if version == 11:
            assert await node.add(pid, epoch, [("t", 0), ("t", 1)]) == {("t", 0): E.none, ("t", 1): E.none}
        assert await node.send(version, pid, epoch, 0, ("t", 0)) == {("t", 0): (E.none, None)}
        ended = await node.end(pid, epoch, commit=True, version=5 if version == 12 else 3)
        assert ended is E.none and node.held            # PrepareCommit, its markers held
        next_epoch = epoch + 1 if version == 12 else epoch
        assert await node.send(version, pid, next_epoch, 0, ("t", 1)) == {("t", 1): expected}
    run(scenario())
