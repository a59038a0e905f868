"""KIP-890 part 1 verification from any broker of a cluster: may this transactional write
land here? The transaction coordinator of the id answers -- in-process when this broker
leads its `__transaction_state` partition, else through AddPartitionsToTxn v4 with
`verify_only`, as Kafka's `AddPartitionsToTxnManager` does. A coordinator that cannot
answer (moving, loading, unreachable) gives NOT_ENOUGH_REPLICAS, Kafka's retriable stand-in
for old clients."""

from __future__ import annotations

from typing import Iterable

from ..coordinator.partitioning import partition_for
from ..coordinator.transaction.log_format import TRANSACTION_STATE_TOPIC
from ..errors import ErrorCode
from .interbroker import BrokerNotAvailable, RequestTimedOut

TopicPartition = tuple[str, int]
_UNAVAILABLE = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                ErrorCode.coordinator_load_in_progress)


async def verify(broker, transactional_id: str, producer_id: int, producer_epoch: int,
                 partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    wanted = list(partitions)
    local = broker.transactions.coordinator.verify_partitions(transactional_id, producer_id, producer_epoch, wanted)
    if broker.membership is None or not any(error in _UNAVAILABLE for error in local.values()):
        return local
    info = broker.metadata.topic(TRANSACTION_STATE_TOPIC)
    leader = None if info is None else broker.metadata.leader(
        TRANSACTION_STATE_TOPIC, partition_for(transactional_id, info.partition_count))
    if leader is None or leader.node_id == broker.node_id:
        return {tp: _retriable(error) for tp, error in local.items()}
    # Imported here, not at start: a kio message module costs a few ms of every broker start.
    from kio.schema.add_partitions_to_txn.v4.request import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnTopic,
        AddPartitionsToTxnTransaction,
    )

    by_topic: dict[str, list[int]] = {}
    for topic, index in wanted:
        by_topic.setdefault(topic, []).append(index)
    request = AddPartitionsToTxnRequest(transactions=(AddPartitionsToTxnTransaction(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch, verify_only=True,
        topics=tuple(AddPartitionsToTxnTopic(name=t, partitions=tuple(p)) for t, p in by_topic.items())),))
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
