"""CreateAcls: SECURITY_DISABLED for every creation, as Kafka answers without an authorizer."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 30
VERSIONS = (0, 3)  # v0 (removed in Kafka 4.0, KIP-896) has no pattern type: LITERAL

NO_AUTHORIZER = "No Authorizer is configured."


async def handle(ctx, request):
    result_type = nested(ctx.response_type, "AclCreationResult")
    results = tuple(make(result_type, error_code=ErrorCode.security_disabled, error_message=NO_AUTHORIZER)
                    for _ in request.creations)
    return make(ctx.response_type, throttle_time=timedelta(0), results=results)
