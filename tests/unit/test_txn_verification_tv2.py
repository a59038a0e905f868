"""A transactions-version-2 write that arrives while the previous transaction's markers are
still being written: the broker asks the coordinator again every
`add.partitions.to.txn.retry.backoff.ms` until `add.partitions.to.txn.retry.backoff.max.ms`,
then answers CONCURRENT_TRANSACTIONS (Kafka's ReplicaManager). In process, one broker."""

from __future__ import annotations

import asyncio
import itertools

from kio.schema.end_txn.v5.request import EndTxnRequest

from ottla.errors import ErrorCode
from ottla.server import txn_verification
from ottla.server.handlers import end_txn
from tests.unit.test_produce_txn_verification import CountingNode
from tests.unit.test_txn_service import run
from tests.waiting import coordinators_loaded

E = ErrorCode
TP = ("t", 0)


class TV2Node(CountingNode):
    async def add(self, pid, epoch):
        (error,) = (await txn_verification.verify(self.broker, "tx", pid, epoch, [TP], add=True)).values()
        return error


async def _committed_with_markers_held(tmp_path, config):
    node = TV2Node(tmp_path, config)
    await node.broker.transactions.start()
    await coordinators_loaded(node.broker)
    node.broker.create_topic("t", 1, {})
    init = await node.init()
    pid, epoch = init.producer_id, init.producer_epoch
    assert await node.add(pid, epoch) is E.none
    ended = await node.call(end_txn, 5, EndTxnRequest(transactional_id="tx", producer_id=pid,
                                                      producer_epoch=epoch, committed=True))
    assert (ended.error_code, ended.producer_epoch) == (E.none, epoch + 1)
    node.asks = 0
    return node, pid, epoch + 1


def test_the_write_waits_for_the_markers_within_the_window(tmp_path):
    async def scenario():
        node, pid, epoch = await _committed_with_markers_held(
            tmp_path, {"add.partitions.to.txn.retry.backoff.ms": 1,
                       "add.partitions.to.txn.retry.backoff.max.ms": 600_000})
        waiting = asyncio.ensure_future(node.add(pid, epoch))
        while node.asks < 2:                    # asked, refused, asked again
            await asyncio.sleep(0.005)
        assert not waiting.done()
        node.release_markers()
        assert await waiting is E.none
        assert node.broker.transactions.coordinator.describe_transactions(["tx"])[0].state == "Ongoing"
    run(scenario())


def test_past_the_window_the_write_is_answered_concurrent_transactions(tmp_path):
    async def scenario():
        node, pid, epoch = await _committed_with_markers_held(
            tmp_path, {"add.partitions.to.txn.retry.backoff.max.ms": 0})
        assert await node.add(pid, epoch) is E.concurrent_transactions
        assert node.asks == 1
    run(scenario())
