"""A Java 4.x transactional producer's requests under transactions version 2 (KIP-890 part 2),
as raw frames built from the protocol schemas: no client in the venv speaks that version."""

from __future__ import annotations

from datetime import timedelta

from kio.schema.end_txn.v5.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v5.request import InitProducerIdRequest
from kio.schema.produce.v12.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.txn_offset_commit.v5.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)

from ottla.records.records import Record, build_batch
from tests.waiting import wait_for
from tests.wire import roundtrip

TID = "java-4x-style"


class RawProducer:
    """The requests a Java 4.x transactional producer sends once the broker finalizes
    `transaction.version` 2, to one partition: `sock` reaches the transaction coordinator,
    `leader` the partition's leader and `group` the group coordinator (default: `sock`)."""

    def __init__(self, sock, topic, *, transactional_id=TID, partition=0, leader=None, group=None):
        self.sock = sock
        self.leader = leader or sock
        self.group = group or sock
        self.topic = topic
        self.transactional_id = transactional_id
        self.partition = partition
        self.sequence = 0
        self.producer_id = self.epoch = -1

    def init(self):
        def attempt():
            _, response = roundtrip(self.sock, InitProducerIdRequest(
                transactional_id=self.transactional_id, transaction_timeout=timedelta(minutes=5)))
            # A fresh broker answers COORDINATOR_LOAD_IN_PROGRESS while it loads the log.
            return response if response.error_code == ErrorCode.none else None
        response = wait_for(attempt, what="InitProducerId")
        self.producer_id, self.epoch, self.sequence = response.producer_id, response.producer_epoch, 0

    def produce(self, value: bytes, epoch: int | None = None, sequence: int | None = None):
        """Produce v12, transactional; (error, base offset). CONCURRENT_TRANSACTIONS (the
        previous transaction's markers still going out, past the broker's own retries) is
        retried, as the client retries it."""
        epoch = self.epoch if epoch is None else epoch
        sequence = self.sequence if sequence is None else sequence
        batch = build_batch([Record(None, value, ())], producer_id=self.producer_id, producer_epoch=epoch,
                            base_sequence=sequence, is_transactional=True)
        request = ProduceRequest(
            transactional_id=self.transactional_id, acks=-1, timeout=timedelta(seconds=30),
            topic_data=(TopicProduceData(name=self.topic, partition_data=(
                PartitionProduceData(index=self.partition, records=batch),)),))

        def attempt():
            result = roundtrip(self.leader, request)[1].responses[0].partition_responses[0]
            return None if result.error_code == ErrorCode.concurrent_transactions else result
        result = wait_for(attempt, what="the previous transaction's markers")
        if result.error_code == ErrorCode.none and epoch == self.epoch:
            self.sequence += 1
        return result.error_code, result.base_offset

    def commit_offsets(self, group: str, offset: int):
        """TxnOffsetCommit v5, with no AddOffsetsToTxn before it."""
        _, response = roundtrip(self.group, TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group, producer_id=self.producer_id,
            producer_epoch=self.epoch, topics=(TxnOffsetCommitRequestTopic(name=self.topic, partitions=(
                TxnOffsetCommitRequestPartition(partition_index=self.partition, committed_offset=offset,
                                                committed_metadata=None),)),)))
        return response.topics[0].partitions[0].error_code

    def settled(self):
        """Wait until the last EndTxn's markers are written (the coordinator's CompleteCommit/
        CompleteAbort): before that, the next EndTxn at the new epoch is PRODUCER_FENCED, as in
        Kafka (a Java client only ends a transaction its writes started, which waits too)."""
        from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest

        def complete():
            _, response = roundtrip(self.sock, DescribeTransactionsRequest(transactional_ids=(self.transactional_id,)))
            return response.transaction_states[0].transaction_state.startswith("Complete")
        wait_for(complete, what="the transaction's markers")

    def end(self, commit: bool, epoch: int | None = None):
        """EndTxn v5; the client carries on with the producer id and epoch it answers."""
        _, response = roundtrip(self.sock, EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.epoch if epoch is None else epoch, committed=commit))
        if response.error_code == ErrorCode.none:
            if (response.producer_id, response.producer_epoch) != (self.producer_id, self.epoch):
                self.sequence = 0  # a new epoch starts its sequences again
            self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        return response
