"""DeleteAcls: SECURITY_DISABLED for every filter, as Kafka answers without an authorizer."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested
from .create_acls import NO_AUTHORIZER

API_KEY = 31
VERSIONS = (0, 3)  # v0 (removed in Kafka 4.0, KIP-896) has no pattern type: LITERAL


async def handle(ctx, request):
    result_type = nested(ctx.response_type, "DeleteAclsFilterResult")
    results = tuple(make(result_type, error_code=ErrorCode.security_disabled, error_message=NO_AUTHORIZER,
                         matching_acls=()) for _ in request.filters)
    return make(ctx.response_type, throttle_time=timedelta(0), filter_results=results)
