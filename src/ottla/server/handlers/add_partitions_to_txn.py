"""AddPartitionsToTxn (client versions): enlist partitions in the producer's transaction.

Versions 4+ batch several transactions and are for brokers: a partition leader in a
cluster verifies a transactional produce with `verify_only` (KIP-890 part 1,
`txn_verification`), or with v5 adds the partition for a client on transactions version 2
(KIP-890 part 2; served while `transaction.version` is 2).
"""

from datetime import timedelta

from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import CLUSTER_NAME, Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 24
VERSIONS = (0, 5)
FIRST_TV2_VERSION = 5


async def _broker_batch(ctx, request):
    """v4+: several transactions, from another broker; `verify_only` adds nothing, and an add
    by v5 is one of transactions version 2."""
    coordinator = ctx.broker.transactions.coordinator
    response_type = ctx.response_type
    result_type = nested(response_type, "AddPartitionsToTxnResult")
    topic_type = nested(response_type, "AddPartitionsToTxnTopicResult")
    partition_type = nested(response_type, "AddPartitionsToTxnPartitionResult")
    results = []
    for txn in request.transactions:
        wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
        if txn.verify_only:
            errors = coordinator.verify_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
        else:
            future, respond = reply_future()
            coordinator.add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted, now_ms(),
                                       respond, transaction_version=2 if ctx.api_version >= FIRST_TV2_VERSION else 0)
            error = await future
            errors = {tp: error for tp in wanted}
        by_topic: dict[str, list] = {}
        for (topic, partition), error in errors.items():
            by_topic.setdefault(topic, []).append(make(partition_type, partition_index=partition,
                                                       partition_error_code=error))
        results.append(make(result_type, transactional_id=txn.transactional_id, topic_results=tuple(
            make(topic_type, name=t, results_by_partition=tuple(r)) for t, r in by_topic.items())))
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none,
                results_by_transaction=tuple(results))


async def handle(ctx, request):
    broker = ctx.broker
    if ctx.api_version >= 4:
        if not authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return make(ctx.response_type, throttle_time=timedelta(0),
                        error_code=ErrorCode.cluster_authorization_failed, results_by_transaction=())
        return await _broker_batch(ctx, request)
    transactional_id = request.v3_and_below_transactional_id
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        errors = {tp: ErrorCode.transactional_id_authorization_failed for tp in wanted}
    else:
        # Kafka adds nothing when any partition is refused: those get their error, the
        # others OPERATION_NOT_ATTEMPTED.
        refused = {tp: ErrorCode.topic_authorization_failed for tp in wanted
                   if not authorized(ctx, Operation.WRITE, ResourceType.TOPIC, tp[0])}
        refused.update({tp: ErrorCode.unknown_topic_or_partition for tp in wanted
                        if tp not in refused and broker.metadata.partition(*tp) is None})
        if refused:
            errors = {tp: refused.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
        else:
            future, respond = reply_future()
            broker.transactions.coordinator.add_partitions(
                transactional_id, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch,
                wanted, now_ms(), respond)
            error = fencing_as_version_says(await future, ctx.api_version, fenced_since=2)
            errors = {tp: error for tp in wanted}

    response_type = ctx.response_type
    topic_type = nested(response_type, "AddPartitionsToTxnTopicResult")
    partition_type = nested(response_type, "AddPartitionsToTxnPartitionResult")
    by_topic: dict[str, list] = {}
    for (topic, partition), error in errors.items():
        by_topic.setdefault(topic, []).append(make(partition_type, partition_index=partition,
                                                   partition_error_code=error))
    return make(response_type, throttle_time=timedelta(0), results_by_topic_v3_and_below=tuple(
        make(topic_type, name=topic, results_by_partition=tuple(results)) for topic, results in by_topic.items()))
