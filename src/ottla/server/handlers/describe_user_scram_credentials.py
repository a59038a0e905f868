"""DescribeUserScramCredentials: mechanisms and iterations of stored credentials (never secrets)."""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested
from ..scram_credentials import for_broker

API_KEY = 50
VERSIONS = (0, 0)


async def handle(ctx, request):
    store = for_broker(ctx.broker)
    result_type = nested(ctx.response_type, "DescribeUserScramCredentialsResult")
    info_type = nested(ctx.response_type, "CredentialInfo")
    names = sorted(store.users) if not request.users else [u.name for u in request.users]
    results = []
    for name in dict.fromkeys(names):
        creds = store.users.get(name)
        if creds is None:
            results.append(make(result_type, user=name, error_code=ErrorCode.resource_not_found,
                                error_message=f"Attempt to describe a user credential that does not exist: {name}",
                                credential_infos=()))
            continue
        infos = tuple(make(info_type, mechanism=m, iterations=c["iterations"]) for m, c in sorted(creds.items()))
        results.append(make(result_type, user=name, error_code=ErrorCode.none, error_message=None,
                            credential_infos=infos))
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, error_message=None,
                results=tuple(results))
