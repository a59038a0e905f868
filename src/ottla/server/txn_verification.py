"""KIP-890 from any broker of a cluster: may this transactional write land here?

Transactions version 1 (part 1) only verifies: the partition must already be in the
producer's ongoing transaction. Version 2 (part 2) adds it: the client no longer sends
AddPartitionsToTxn, and the partition leader asks the coordinator to enlist the partition
before the first write to it. The transaction coordinator of the id answers -- in-process
when this broker leads its `__transaction_state` partition, else through AddPartitionsToTxn
(v4 `verify_only` to verify, v5 to add), as Kafka's `AddPartitionsToTxnManager` does. A
coordinator that cannot answer (moving, loading, unreachable) gives NOT_ENOUGH_REPLICAS,
Kafka's retriable stand-in for old clients. An add that meets the previous transaction's
markers still being written (CONCURRENT_TRANSACTIONS) is retried here for a moment
(`add.partitions.to.txn.retry.backoff.ms` up to `.max.ms`), as Kafka does, since that is
the usual state right after the client's EndTxn. A write to a partition whose log already
holds the producer's ongoing transaction at that epoch asks nobody (`ongoing_here`), as
Kafka's `UnifiedLog.maybeStartTransactionVerification` skips it: only a transaction's first
write to a partition costs a coordinator round trip."""

from __future__ import annotations

import asyncio
import time
from typing import Iterable

from ..coordinator.partitioning import partition_for
from ..coordinator.transaction.log_format import TRANSACTION_STATE_TOPIC
from ..errors import ErrorCode
from .clock import now_ms
from .interbroker import BrokerNotAvailable, RequestTimedOut
from .replies import reply_future
from .steps import producer_state_ready

TopicPartition = tuple[str, int]
_UNAVAILABLE = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                ErrorCode.coordinator_load_in_progress)


def producer_entry(broker, tp: TopicPartition, producer_id: int):
    """The producer's state in the log of `tp` if this broker leads it (None otherwise); every
    batch of the producer appended there changes it (its last offset at least)."""
    partition = broker.replicas.partitions.get(tp)
    if partition is None or not partition.is_leader:
        return None
    return partition.log.producer_state.entry(producer_id)


async def producer_state_loaded(broker, tp: TopicPartition) -> None:
    """Before `producer_entry` on a partition this broker leads: its producer state loaded in
    steps if this is its first use (`steps.producer_state_ready`)."""
    partition = broker.replicas.partitions.get(tp)
    if partition is not None and partition.is_leader and not partition.log.producer_state_ready:
        await producer_state_ready(partition.log)


def ongoing_here(broker, tp: TopicPartition, producer_id: int, producer_epoch: int) -> bool:
    """Does this broker lead `tp` with the producer's transaction at `producer_epoch` open in its
    log? Then the coordinator has already added the partition (Kafka's `hasOngoingTransaction`)."""
    entry = producer_entry(broker, tp, producer_id)
    return entry is not None and entry.txn_first_offset is not None and entry.epoch == producer_epoch


async def verify(broker, transactional_id: str, producer_id: int, producer_epoch: int,
                 partitions: Iterable[TopicPartition], *, add: bool = False) -> dict[TopicPartition, ErrorCode]:
    """Per partition: ErrorCode.none when the write may go ahead. `add`: transactions
    version 2, enlist the partitions rather than only check them."""
    wanted = list(partitions)
    if not add:
        return await _ask(broker, transactional_id, producer_id, producer_epoch, wanted, add)
    config = broker.config
    backoff_s = config["add.partitions.to.txn.retry.backoff.ms"] / 1000
    deadline = time.monotonic() + config["add.partitions.to.txn.retry.backoff.max.ms"] / 1000
    while True:
        answers = await _ask(broker, transactional_id, producer_id, producer_epoch, wanted, add)
        if ErrorCode.concurrent_transactions not in answers.values() or time.monotonic() >= deadline:
            return answers
        await asyncio.sleep(backoff_s)


async def _ask(broker, transactional_id: str, producer_id: int, producer_epoch: int,
               wanted: list[TopicPartition], add: bool) -> dict[TopicPartition, ErrorCode]:
    coordinator = broker.transactions.coordinator
    if add:
        future, respond = reply_future()
        coordinator.add_partitions(transactional_id, producer_id, producer_epoch, wanted, now_ms(), respond,
                                   transaction_version=2)
        error = await future
        local = {tp: error for tp in wanted}
    else:
        local = coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, wanted)
    if broker.membership is None or not any(error in _UNAVAILABLE for error in local.values()):
        return {tp: _retriable(error) for tp, error in local.items()} if add else local
    info = broker.metadata.topic(TRANSACTION_STATE_TOPIC)
    leader = None if info is None else broker.metadata.leader(
        TRANSACTION_STATE_TOPIC, partition_for(transactional_id, info.partition_count))
    if leader is None or leader.node_id == broker.node_id:
        return {tp: _retriable(error) for tp, error in local.items()}
    # Imported here, not at start: a kio message module costs a few ms of every broker start.
    if add:
        from kio.schema.add_partitions_to_txn.v5 import request as schema
    else:
        from kio.schema.add_partitions_to_txn.v4 import request as schema

    by_topic: dict[str, list[int]] = {}
    for topic, index in wanted:
        by_topic.setdefault(topic, []).append(index)
    request = schema.AddPartitionsToTxnRequest(transactions=(schema.AddPartitionsToTxnTransaction(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
        verify_only=not add, topics=tuple(schema.AddPartitionsToTxnTopic(name=t, partitions=tuple(p))
                                          for t, p in by_topic.items())),))
    try:
        response = await broker.interbroker.send(leader.node_id, leader.host, leader.port, request)
    except (BrokerNotAvailable, RequestTimedOut):
        return {tp: ErrorCode.not_enough_replicas for tp in wanted}
    if response.error_code != ErrorCode.none:
        return {tp: _retriable(response.error_code) for tp in wanted}
    answers = {(topic.name, p.partition_index): p.partition_error_code
               for result in response.results_by_transaction for topic in result.topic_results
               for p in topic.results_by_partition}
    return {tp: _retriable(answers.get(tp, ErrorCode.not_enough_replicas)) for tp in wanted}


def _retriable(error: ErrorCode) -> ErrorCode:
    return ErrorCode.not_enough_replicas if error in _UNAVAILABLE else error
