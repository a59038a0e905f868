"""UpdateMetadata: the controller's view of the cluster, for this broker's metadata cache."""

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make

API_KEY = 6
VERSIONS = (5, 8)  # topic states grouped by topic; the controller sends v8


async def handle(ctx, request):
    link = ctx.broker.controller_link
    if link is None:
        return make(ctx.response_type, error_code=ErrorCode.stale_controller_epoch)
    try:
        await link.update_metadata(request)
    except KafkaError as exc:
        return make(ctx.response_type, error_code=exc.code)
    return make(ctx.response_type, error_code=ErrorCode.none)
