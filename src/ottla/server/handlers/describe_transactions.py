"""DescribeTransactions (KIP-664): state, epoch, timeout and partitions of transactional ids."""

import datetime
from datetime import timedelta

from ..replies import authorized
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested

API_KEY = 65
VERSIONS = (0, 0)


def _start_time(ms: int) -> datetime.datetime:
    # -1 (no transaction yet) must survive the round trip through a datetime.
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


async def handle(ctx, request):
    response_type = ctx.response_type
    state_type = nested(response_type, "TransactionState")
    topic_type = nested(response_type, "TopicData")
    allowed = [tid for tid in request.transactional_ids
               if authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid)]
    described = {d.transactional_id: d for d in ctx.broker.transactions.coordinator.describe_transactions(allowed)}
    states = []
    for transactional_id in request.transactional_ids:
        description = described.get(transactional_id)
        if description is None:
            states.append(make(state_type, error_code=ErrorCode.transactional_id_authorization_failed,
                               transactional_id=transactional_id, transaction_state="",
                               transaction_timeout=timedelta(0), transaction_start_time=_start_time(-1),
                               producer_id=-1, producer_epoch=-1, topics=()))
            continue
        # Partitions of topics the principal may not describe are left out, as in Kafka.
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(description.partitions):
            if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                by_topic.setdefault(topic, []).append(partition)
        states.append(make(
            state_type, error_code=description.error, transactional_id=transactional_id,
            transaction_state=description.state, transaction_timeout=timedelta(milliseconds=description.timeout_ms),
            transaction_start_time=_start_time(description.start_ms), producer_id=description.producer_id,
            producer_epoch=description.producer_epoch,
            topics=tuple(make(topic_type, topic=t, partitions=tuple(p)) for t, p in by_topic.items())))
    return make(response_type, throttle_time=timedelta(0), transaction_states=tuple(states))
