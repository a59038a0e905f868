"""DescribeAcls: SECURITY_DISABLED, as Kafka answers without an authorizer."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make
from .create_acls import NO_AUTHORIZER

API_KEY = 29
VERSIONS = (1, 3)


async def handle(ctx, request):
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.security_disabled,
                error_message=NO_AUTHORIZER, resources=())
