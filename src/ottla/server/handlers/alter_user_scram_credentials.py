"""AlterUserScramCredentials: upsert and delete SCRAM credentials, validated as Kafka does."""

from collections import Counter
from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make, nested
from ..scram_credentials import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, for_broker

API_KEY = 51
VERSIONS = (0, 0)


def _problem(store, user: str, mechanism: int, iterations: int | None, duplicates: Counter):
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if duplicates[(user, mechanism)] > 1:
        return ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request"
    if mechanism not in MECHANISMS:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if iterations is None:
        if mechanism not in store.users.get(user, {}):
            return ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"
    elif not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        return (ErrorCode.unacceptable_credential,
                f"Iterations {iterations} must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
    return None


async def handle(ctx, request):
    store = for_broker(ctx.broker)
    duplicates = Counter((c.name, c.mechanism) for c in (*request.deletions, *request.upsertions))
    failed: dict[str, tuple] = {}
    changes = [(d.name, d.mechanism, None, d) for d in request.deletions]
    changes += [(u.name, u.mechanism, u.iterations, u) for u in request.upsertions]
    for user, mechanism, iterations, _ in changes:
        if user not in failed and (problem := _problem(store, user, mechanism, iterations, duplicates)):
            failed[user] = problem
    for user, mechanism, iterations, change in changes:
        if user in failed:
            continue  # Kafka applies none of a user's changes when one of them is invalid
        if iterations is None:
            store.delete(user, mechanism)
        else:
            store.upsert(user, mechanism, iterations, change.salt, change.salted_password)
    if len(failed) < len({user for user, *_ in changes}):
        store.save()
    result_type = nested(ctx.response_type, "AlterUserScramCredentialsResult")
    users = list(dict.fromkeys(user for user, *_ in changes))
    results = tuple(make(result_type, user=user, error_code=failed.get(user, (ErrorCode.none, None))[0],
                         error_message=failed.get(user, (ErrorCode.none, None))[1]) for user in users)
    return make(ctx.response_type, throttle_time=timedelta(0), results=results)
