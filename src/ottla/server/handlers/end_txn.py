"""EndTxn: commit or abort. Answered once the decision is durable; the markers follow.

Version 5 (transactions v2, KIP-890: the epoch is bumped at every EndTxn) is not served, so
clients stay on the v1 protocol.
"""

from datetime import timedelta

from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 26
# v2 added PRODUCER_FENCED, v4 TRANSACTION_ABORTABLE (never returned here).
VERSIONS = (0, 4)


async def handle(ctx, request):
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    else:
        future, respond = reply_future()
        ctx.broker.transactions.coordinator.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed,
            now_ms(), respond)
        error = fencing_as_version_says(await future, ctx.api_version, fenced_since=2)
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=error)
