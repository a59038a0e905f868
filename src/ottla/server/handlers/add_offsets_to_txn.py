"""AddOffsetsToTxn: enlist the consumer group's `__consumer_offsets` partition in the
transaction, before the producer's TxnOffsetCommit writes the offsets there."""

from datetime import timedelta

from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 25
# v2 added PRODUCER_FENCED, v4 TRANSACTION_ABORTABLE (never returned here).
VERSIONS = (0, 4)


async def handle(ctx, request):
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        error = ErrorCode.group_authorization_failed
    else:
        future, respond = reply_future()
        ctx.broker.transactions.coordinator.add_offsets(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id,
            now_ms(), respond)
        error = fencing_as_version_says(await future, ctx.api_version, fenced_since=2)
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=error)
