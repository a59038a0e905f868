"""ListTransactions (KIP-664): transactional ids this coordinator knows, with filters."""

from datetime import timedelta

from ..replies import authorized
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 66
# v1 added the duration filter (KIP-994), v2 the transactional id pattern (KIP-1152).
VERSIONS = (0, 2)


async def handle(ctx, request):
    result = ctx.broker.transactions.coordinator.list_transactions(
        now_ms(),
        state_filters=request.state_filters,
        producer_id_filters=request.producer_id_filters,
        duration_filter_ms=getattr(request, "duration_filter", -1),
        transactional_id_pattern=getattr(request, "transactional_id_pattern", None),
    )
    state_type = nested(ctx.response_type, "TransactionState")
    # Like Kafka, only the ids the principal may describe are listed; the rest are silently left out.
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=result.error,
                unknown_state_filters=result.unknown_state_filters,
                transaction_states=tuple(make(state_type, transactional_id=t.transactional_id,
                                              producer_id=t.producer_id, transaction_state=t.state)
                                         for t in result.transactions
                                         if authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                                       t.transactional_id)))
