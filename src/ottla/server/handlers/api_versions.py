"""ApiVersions: the versions we serve, derived from the handler table (one source of truth),
and from v3 the features (KIP-584): `transaction.version` as `server/features.py` says."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested
from .. import features

API_KEY = 18
VERSIONS = (0, 4)


async def handle(ctx, request):
    response_type = ctx.response_type
    api_version = nested(response_type, "ApiVersion")
    keys = tuple(
        make(api_version, api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ctx.broker.supported_versions.items())
    )
    supported, finalized, epoch = (), (), -1
    if ctx.api_version >= 3:
        supported_type = nested(response_type, "SupportedFeatureKey")
        finalized_type = nested(response_type, "FinalizedFeatureKey")
        # Before v4 Kafka leaves out the features whose minimum version is 0.
        supported = tuple(make(supported_type, name=name, min_version=low, max_version=high)
                          for name, low, high in features.supported_features() if low > 0 or ctx.api_version >= 4)
        finalized = tuple(make(finalized_type, name=name, min_version_level=level, max_version_level=level)
                          for name, level in features.finalized_features(ctx.broker.config))
        # Clients keep the features of the broker with the highest epoch, and ignore -1.
        epoch = ctx.broker.features_epoch
    return make(
        response_type,
        error_code=ErrorCode.none,
        api_keys=keys,
        throttle_time=timedelta(0),
        supported_features=supported,
        finalized_features_epoch=epoch,
        finalized_features=finalized,
        zk_migration_ready=False,
    )
