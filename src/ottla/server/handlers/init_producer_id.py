"""InitProducerId: a fresh producer id for an idempotent producer; for a transactional one,
the id's producer id and a new epoch from the transaction coordinator (fencing the previous
instance and aborting what it left open)."""

from datetime import timedelta

from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode, KafkaError
from ...producer_state.authorizer import Operation, ResourceType, require_idempotent_write
from ...protocol.build import make
from ..clock import now_ms

API_KEY = 22
# v3 added KIP-360's producer id and epoch, v4 PRODUCER_FENCED, v5 TRANSACTION_ABORTABLE
# (never returned here); v6 is KIP-939 two-phase commit, not offered.
VERSIONS = (0, 5)
NO_PRODUCER_ID = -1


async def handle(ctx, request):
    error, producer_id, producer_epoch = await _init(ctx, request)
    error = fencing_as_version_says(error, ctx.api_version, fenced_since=4)
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=error,
                producer_id=producer_id, producer_epoch=producer_epoch)


async def _init(ctx, request) -> tuple[ErrorCode, int, int]:
    broker = ctx.broker
    transactional_id = request.transactional_id
    if transactional_id is None:
        try:
            require_idempotent_write(broker.authorizer, ctx.principal)
        except KafkaError as exc:
            return exc.code, NO_PRODUCER_ID, -1
        return ErrorCode.none, broker.producer_ids.generate_producer_id(), 0
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return ErrorCode.transactional_id_authorization_failed, NO_PRODUCER_ID, -1
    producer_id = getattr(request, "producer_id", NO_PRODUCER_ID)
    producer_epoch = getattr(request, "producer_epoch", -1)
    if (producer_id == NO_PRODUCER_ID) != (producer_epoch == -1):
        return ErrorCode.invalid_request, NO_PRODUCER_ID, -1
    expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
    timeout_ms = int(request.transaction_timeout / timedelta(milliseconds=1))
    future, respond = reply_future()
    broker.transactions.coordinator.init_producer_id(transactional_id, timeout_ms, expected, now_ms(), respond)
    result = await future
    return result.error, result.producer_id, result.producer_epoch
