"""ApiVersions: the versions we serve, derived from the handler table (one source of truth)."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested

API_KEY = 18
VERSIONS = (0, 4)


async def handle(ctx, request):
    response_type = ctx.response_type
    api_version = nested(response_type, "ApiVersion")
    keys = tuple(
        make(api_version, api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ctx.broker.supported_versions.items())
    )
    return make(
        response_type,
        error_code=ErrorCode.none,
        api_keys=keys,
        throttle_time=timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
