"""DescribeAcls: SECURITY_DISABLED, as Kafka answers without an authorizer."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make
from .create_acls import NO_AUTHORIZER

API_KEY = 29
VERSIONS = (0, 3)  # v0 (removed in Kafka 4.0, KIP-896) has no pattern type: LITERAL


async def handle(ctx, request):
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.security_disabled,
                error_message=NO_AUTHORIZER, resources=())
