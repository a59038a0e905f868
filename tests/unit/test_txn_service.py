"""The transaction coordinator inside a real broker (in process, no sockets): the request
handlers, `__transaction_state` on disk, markers through WriteTxnMarkers, restarts."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest
from kio.schema.add_offsets_to_txn.v0.request import AddOffsetsToTxnRequest
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_transactions.v1.request import ListTransactionsRequest
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
)

from ottla.config import BrokerConfig
from ottla.coordinator.group.records import OFFSETS_TOPIC
from ottla.coordinator.transaction import TRANSACTION_STATE_TOPIC, partition_for
from ottla.coordinator.transaction.service import TransactionService
from ottla.errors import ErrorCode
from ottla.producer_state.authorizer import CLUSTER_NAME
from ottla.producer_state.authorizer import Operation as Op
from ottla.producer_state.authorizer import ResourceType as R
from ottla.protocol.codec import encode_response
from ottla.records.batch import parse_batches
from ottla.records.records import Record, build_batch, iter_batches
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.context import RequestContext
from ottla.server.coordinator_runtime import BrokerMarkerChannel
from ottla.server.metadata_cache import PartitionState
from ottla.server.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    describe_transactions,
    end_txn,
    init_producer_id,
    list_transactions,
    txn_offset_commit,
    write_txn_markers,
)
from tests.waiting import coordinators_loaded

E = ErrorCode


class Node:
    """A broker with its transaction service, driven by calling handlers directly."""

    def __init__(self, data_dir, ids, config=None):
        self.broker = Broker(data_dir, BrokerConfig(config or {}))
        self.broker.transactions = TransactionService(self.broker.coordinator_runtime, BrokerMarkerChannel(self.broker, self.broker.interbroker),
                                                      self.broker.config, lambda: next(ids), now_ms)

    async def call(self, module, version, request):
        ctx = RequestContext(self.broker, module.API_KEY, version, None, "test")
        response = await module.handle(ctx, request)
        encode_response(module.API_KEY, version, 1, response)     # the response must encode
        return response

    async def init(self, tid="tx", version=4, **kw):
        return await self.call(init_producer_id, version, InitProducerIdRequest(
            transactional_id=tid, transaction_timeout=timedelta(seconds=60), **kw))

    async def add(self, pid, epoch, partitions, tid="tx"):
        topics = {}
        for topic, p in partitions:
            topics.setdefault(topic, []).append(p)
        response = await self.call(add_partitions_to_txn, 3, AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=tuple(AddPartitionsToTxnTopic(name=t, partitions=tuple(p)) for t, p in topics.items())))
        return {(t.name, r.partition_index): r.partition_error_code
                for t in response.results_by_topic_v3_and_below for r in t.results_by_partition}

    async def end(self, pid, epoch, commit, tid="tx", version=3):
        response = await self.call(end_txn, version, EndTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit))
        return response.error_code

    def produce(self, topic, partition, pid, epoch, seq, value=b"v"):
        batch = build_batch([Record(b"k", value)], producer_id=pid, producer_epoch=epoch,
                            base_sequence=seq, is_transactional=True)
        return self.broker.replicas.append(topic, partition, batch, now_ms=now_ms(), origin="client")

    def control_batches(self, topic, partition):
        log = self.broker.logs.get_log(topic, partition)
        data = log.read(0, 1 << 20, max_offset=log.log_end_offset).records
        return [(h.base_offset, h.producer_id, h.producer_epoch, records[0].key)
                for h, records in iter_batches(data) if h.is_control]


async def started_node(tmp_path, topics=("t",)) -> Node:
    """A node whose transaction coordinator has loaded, with one-partition `topics`."""
    node = Node(tmp_path, itertools.count(7))
    await node.broker.transactions.start()
    await coordinators_loaded(node.broker)
    for topic in topics:
        node.broker.create_topic(topic, 1, {})
    return node


async def settle():
    for _ in range(20):
        await asyncio.sleep(0.01)


def run(coro):
    return asyncio.run(coro)


COMMIT_KEY = b"\x00\x00\x00\x01"
ABORT_KEY = b"\x00\x00\x00\x00"


def test_commit_writes_markers_and_moves_the_lso(tmp_path):
    async def scenario():
        node = Node(tmp_path, itertools.count(7))
        await node.broker.transactions.start()
        await coordinators_loaded(node.broker)
        node.broker.create_topic("t", 2, {})
        init = await node.init()
        assert (init.error_code, init.producer_id, init.producer_epoch) == (E.none, 7, 0)
        assert await node.add(7, 0, [("t", 0), ("t", 1)]) == {("t", 0): E.none, ("t", 1): E.none}
        node.produce("t", 0, 7, 0, 0)
        log = node.broker.logs.get_log("t", 0)
        assert (log.last_stable_offset, log.high_watermark) == (0, 1)
        assert await node.end(7, 0, commit=True) is E.none
        await settle()
        assert node.control_batches("t", 0) == [(1, 7, 0, COMMIT_KEY)]
        assert node.control_batches("t", 1) == [(0, 7, 0, COMMIT_KEY)]
        assert log.last_stable_offset == log.high_watermark == 2
        # Every state change is in __transaction_state-<partition for "tx">.
        state_log = node.broker.logs.get_log(TRANSACTION_STATE_TOPIC, partition_for("tx", 50))
        assert state_log.log_end_offset == 4        # Empty, Ongoing, PrepareCommit, CompleteCommit
        node.broker.transactions.stop()
    run(scenario())


def test_unknown_partition_is_not_added(tmp_path):
    async def scenario():
        node = await started_node(tmp_path)
        await node.init()
        assert await node.add(7, 0, [("t", 0), ("missing", 0)]) == {
            ("t", 0): E.operation_not_attempted, ("missing", 0): E.unknown_topic_or_partition}
        (described,) = (await node.call(describe_transactions, 0,
                                        DescribeTransactionsRequest(transactional_ids=("tx",)))).transaction_states
        assert (described.transaction_state, described.topics) == ("Empty", ())
        node.broker.transactions.stop()
    run(scenario())


@pytest.mark.parametrize("version,fenced_error", [(1, E.invalid_producer_epoch), (2, E.producer_fenced)])
def test_fenced_error_code_depends_on_the_request_version(tmp_path, version, fenced_error):
    async def scenario():
        node = await started_node(tmp_path)
        await node.init()
        await node.init()                                   # a second instance: epoch 1
        assert await node.end(7, 0, commit=True, version=version) is fenced_error
        init = await node.init(version=3, producer_id=7, producer_epoch=0)
        assert init.error_code is E.invalid_producer_epoch
        init = await node.init(version=4, producer_id=7, producer_epoch=0)
        assert init.error_code is E.producer_fenced
        init = await node.init(version=4, producer_id=7, producer_epoch=-1)
        assert init.error_code is E.invalid_request
        offsets = await node.call(add_offsets_to_txn, 0, AddOffsetsToTxnRequest(
            transactional_id="tx", producer_id=7, producer_epoch=0, group_id="g"))
        assert offsets.error_code is E.invalid_producer_epoch
        node.broker.transactions.stop()
    run(scenario())


def test_restart_rolls_forward_a_decided_commit(tmp_path):
    async def first_life():
        node = await started_node(tmp_path)
        await node.init()
        await node.add(7, 0, [("t", 0)])
        node.produce("t", 0, 7, 0, 0)
        # The coordinator dies right after PrepareCommit: no marker leaves it.
        node.broker.transactions.markers.write_markers = lambda *args: None
        assert await node.end(7, 0, commit=True) is E.none
        await settle()
        assert node.control_batches("t", 0) == []
        node.broker.transactions.stop()
        node.broker.logs.close()
        node.broker.release_data_dir()  # the process dies; the OS drops its lock

    async def second_life():
        node = Node(tmp_path, itertools.count(100))
        await node.broker.transactions.start()
        await coordinators_loaded(node.broker)
        await settle()
        assert node.control_batches("t", 0) == [(1, 7, 0, COMMIT_KEY)]
        log = node.broker.logs.get_log("t", 0)
        assert log.last_stable_offset == log.high_watermark == 2
        # The client's EndTxn retry learns the outcome; the id keeps its producer id.
        assert await node.end(7, 0, commit=True) is E.none
        init = await node.init()
        assert (init.producer_id, init.producer_epoch) == (7, 1)
        listed = await node.call(list_transactions, 1, ListTransactionsRequest(state_filters=(), producer_id_filters=()))
        assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [("tx", "Empty")]
        node.broker.transactions.stop()

    run(first_life())
    run(second_life())


def test_markers_for_a_deleted_topic_are_dropped(tmp_path):
    async def scenario():
        node = await started_node(tmp_path, ("t", "gone"))
        await node.init()
        await node.add(7, 0, [("t", 0), ("gone", 0)])
        node.broker.delete_topic("gone")
        assert await node.end(7, 0, commit=False) is E.none
        await settle()
        assert node.control_batches("t", 0) == [(0, 7, 0, ABORT_KEY)]
        (described,) = (await node.call(describe_transactions, 0,
                                        DescribeTransactionsRequest(transactional_ids=("tx",)))).transaction_states
        assert described.transaction_state == "CompleteAbort"
        node.broker.transactions.stop()
    run(scenario())


def test_state_log_is_a_compacted_internal_topic(tmp_path):
    async def scenario():
        node = Node(tmp_path, itertools.count(7))
        await node.broker.transactions.start()
        await coordinators_loaded(node.broker)
        info = node.broker.logs.topics[TRANSACTION_STATE_TOPIC]
        assert info.partitions == 50
        assert info.config["cleanup.policy"] == "compact"
        await node.init()
        state_log = node.broker.logs.get_log(TRANSACTION_STATE_TOPIC, partition_for("tx", 50))
        (header,) = parse_batches(bytearray(state_log.read(0, 1 << 20, max_offset=1).records))
        assert (header.producer_id, header.is_transactional, header.compression) == (-1, False, 0)
        node.broker.transactions.stop()
    run(scenario())


def test_idempotent_producers_get_fresh_ids_without_the_coordinator(tmp_path):
    async def scenario():
        node = Node(tmp_path, itertools.count(7))
        first = await node.init(tid=None, version=0)
        second = await node.init(tid=None, version=4)
        assert (first.error_code, second.error_code) == (E.none, E.none)
        assert (first.producer_epoch, second.producer_epoch) == (0, 0)
        assert second.producer_id == first.producer_id + 1
        assert TRANSACTION_STATE_TOPIC not in node.broker.logs.topics
    run(scenario())


def test_offsets_inside_a_transaction(tmp_path):
    async def scenario():
        node = Node(tmp_path, itertools.count(7))
        groups = node.broker.groups
        await groups.start()
        await node.broker.transactions.start()
        await coordinators_loaded(node.broker)
        node.broker.create_topic("in", 1, {})

        async def commit_offset(offset, epoch=0):
            response = await node.call(txn_offset_commit, 3, TxnOffsetCommitRequest(
                transactional_id="tx", group_id="g", producer_id=7, producer_epoch=epoch, generation_id=-1,
                member_id="", group_instance_id=None, topics=(TxnOffsetCommitRequestTopic(name="in", partitions=(
                    TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                    committed_leader_epoch=-1, committed_metadata=""),)),)))
            return response.topics[0].partitions[0].error_code

        def committed():
            result = groups.coordinator.fetch_offsets(group_id="g", partitions=[("in", 0)])
            return result.offsets["in", 0].offset

        async def add_offsets():
            response = await node.call(add_offsets_to_txn, 0, AddOffsetsToTxnRequest(
                transactional_id="tx", producer_id=7, producer_epoch=0, group_id="g"))
            return response.error_code

        await node.init()
        # KIP-890 part 1: the offsets partition must be in the transaction first.
        assert await commit_offset(5) is E.invalid_txn_state
        assert await add_offsets() is E.none
        assert await commit_offset(5, epoch=1) is E.invalid_producer_epoch
        assert await commit_offset(5) is E.none
        assert committed() == -1                          # staged until the marker
        assert await node.end(7, 0, commit=True) is E.none
        await settle()
        assert committed() == 5
        offsets_partition = groups.coordinator.partition_for("g")
        assert node.control_batches("__consumer_offsets", offsets_partition)[-1][3] == COMMIT_KEY

        assert await add_offsets() is E.none
        assert await commit_offset(9) is E.none
        assert await node.end(7, 0, commit=False) is E.none
        await settle()
        assert committed() == 5                           # the aborted commit is dropped
        node.broker.transactions.stop()
        groups.stop()
    run(scenario())


class Refusing:
    """An authorizer that refuses the listed (operation, resource type, name) triples."""

    def __init__(self, *refused):
        self.refused = {(op.value, rtype.value, name) for op, rtype, name in refused}

    def authorize(self, principal, operation, resource):
        return (operation.value, resource.type.value, resource.name) not in self.refused


def test_acls_are_checked_in_kafkas_terms(tmp_path):
    async def scenario():
        node = await started_node(tmp_path, ("t", "secret"))
        await node.init()
        await node.init(tid="hidden")
        node.broker.authorizer = Refusing((Op.WRITE, R.TRANSACTIONAL_ID, "denied"), (Op.WRITE, R.TOPIC, "secret"),
                                          (Op.READ, R.GROUP, "g"), (Op.DESCRIBE, R.TRANSACTIONAL_ID, "hidden"),
                                          (Op.CLUSTER_ACTION, R.CLUSTER, CLUSTER_NAME))
        assert (await node.init(tid="denied")).error_code is E.transactional_id_authorization_failed
        assert await node.add(7, 0, [("t", 0)], tid="denied") == {("t", 0): E.transactional_id_authorization_failed}
        assert await node.add(7, 0, [("t", 0), ("secret", 0)]) == {
            ("t", 0): E.operation_not_attempted, ("secret", 0): E.topic_authorization_failed}
        assert await node.end(7, 0, commit=True, tid="denied") is E.transactional_id_authorization_failed
        offsets = await node.call(add_offsets_to_txn, 0, AddOffsetsToTxnRequest(
            transactional_id="tx", producer_id=7, producer_epoch=0, group_id="g"))
        assert offsets.error_code is E.group_authorization_failed
        listed = await node.call(list_transactions, 1, ListTransactionsRequest(state_filters=(), producer_id_filters=()))
        assert [t.transactional_id for t in listed.transaction_states] == ["tx"]
        described = await node.call(describe_transactions, 0, DescribeTransactionsRequest(transactional_ids=("hidden", "tx")))
        assert [s.error_code for s in described.transaction_states] == [E.transactional_id_authorization_failed, E.none]
        markers = await node.call(write_txn_markers, 1, WriteTxnMarkersRequest(markers=(WritableTxnMarker(
            producer_id=7, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
            topics=(WritableTxnMarkerTopic(name="t", partition_indexes=(0,)),)),)))
        assert markers.markers[0].topics[0].partitions[0].error_code is E.cluster_authorization_failed
        assert node.control_batches("t", 0) == []
        node.broker.transactions.stop()
    run(scenario())


def test_a_new_leader_epoch_on_the_same_leader_keeps_the_coordinators_loaded(tmp_path):
    """The controller bumps the leader epoch of a partition whose follower died (it leaves the
    ISR) or that is reassigned, its leader staying. As in Kafka, a coordinator loads a partition
    on becoming its leader, not on each new epoch: no COORDINATOR_LOAD_IN_PROGRESS, and an open
    transaction goes on. Losing the leadership and taking it back does load again."""
    async def scenario():
        node = await started_node(tmp_path)
        await node.broker.groups.start()
        await coordinators_loaded(node.broker)
        me, dead_follower, new_leader = node.broker.node_id, 90, 91

        def next_epoch(leader: int, isr: tuple[int, ...]) -> None:
            """LeaderAndIsr at the next epoch for every partition of both internal topics."""
            replicas = node.broker.replicas
            assert replicas.apply_partition_states([
                PartitionState(topic, index, leader, partition.leader_epoch + 1, (me, dead_follower, new_leader), isr)
                for (topic, index), partition in sorted(replicas.partitions.items())
                if topic in (TRANSACTION_STATE_TOPIC, OFFSETS_TOPIC)])

        def loading() -> tuple[ErrorCode, ErrorCode]:
            return (node.broker.transactions.coordinator.list_transactions(0).error,
                    node.broker.groups.coordinator.list_groups().error)

        init = await node.init()
        assert await node.add(init.producer_id, 0, [("t", 0)]) == {("t", 0): E.none}
        next_epoch(me, isr=(me,))
        assert loading() == (E.none, E.none)
        assert await node.end(init.producer_id, 0, commit=True) is E.none
        await settle()
        assert node.control_batches("t", 0) == [(0, init.producer_id, 0, COMMIT_KEY)]

        next_epoch(new_leader, isr=(me, new_leader))
        next_epoch(me, isr=(me, new_leader))
        assert loading() == (E.coordinator_load_in_progress, E.coordinator_load_in_progress)
        await coordinators_loaded(node.broker)
        node.broker.transactions.stop()
        node.broker.groups.stop()
    run(scenario())


def test_markers_are_retried_on_the_partitions_whose_leader_moved_until_written():
    """WriteTxnMarkers to a partition whose leader is moving answers NOT_LEADER_OR_FOLLOWER:
    that partition alone is sent again, and the completion waits until it has its marker."""
    from ottla.coordinator.transaction.service import MarkerSender

    class Channel:
        def __init__(self):
            self.asked: list[frozenset] = []

        async def write_txn_markers(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions,
                                    transaction_version):
            self.asked.append(partitions)
            moving = len(self.asked) < 3  # ("b", 0) has its new leader from the third request on
            return {tp: ErrorCode.not_leader_or_follower if tp == ("b", 0) and moving else ErrorCode.none
                    for tp in partitions}

    class Runtime:
        def topic_exists(self, topic):
            return True

    async def main():
        channel = Channel()
        done = asyncio.get_running_loop().create_future()
        MarkerSender(channel, Runtime()).write_markers(7, 0, 3, True, frozenset({("a", 0), ("b", 0)}),
                                                       done.set_result)
        assert await done == ErrorCode.none
        return channel.asked

    assert asyncio.run(main()) == [frozenset({("a", 0), ("b", 0)}), frozenset({("b", 0)}), frozenset({("b", 0)})]
