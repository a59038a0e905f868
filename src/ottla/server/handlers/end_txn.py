"""EndTxn: commit or abort. Answered once the decision is durable; the markers follow.

Version 5 is transactions version 2 (KIP-890 part 2): the coordinator bumps the producer epoch
at every EndTxn and the answer carries the producer id and epoch the client continues with.
It is served only while the broker offers `transaction.version` 2 (`server/features.py`).
"""

from datetime import timedelta

from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 26
# v2 added PRODUCER_FENCED, v4 TRANSACTION_ABORTABLE (never returned here), v5 the epoch bump.
VERSIONS = (0, 5)
FIRST_TV2_VERSION = 5


async def handle(ctx, request):
    producer_id, producer_epoch = -1, -1
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif ctx.api_version >= FIRST_TV2_VERSION:
        future, respond = reply_future()
        ctx.broker.transactions.coordinator.end_txn_v2(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed,
            now_ms(), respond)
        result = await future
        error, producer_id, producer_epoch = result.error, result.producer_id, result.producer_epoch
    else:
        future, respond = reply_future()
        ctx.broker.transactions.coordinator.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed,
            now_ms(), respond)
        error = fencing_as_version_says(await future, ctx.api_version, fenced_since=2)
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=error,
                producer_id=producer_id, producer_epoch=producer_epoch)
