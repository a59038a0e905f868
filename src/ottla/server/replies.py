"""What handlers of coordinator APIs share: deferred replies and the ACL question."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ..errors import ErrorCode
from ..producer_state.authorizer import Operation, Resource, ResourceType


def reply_future() -> tuple[asyncio.Future, Callable[[Any], None]]:
    """A future and the `on_complete`/`respond` callback a coordinator resolves it with.

    The callback ignores a future already done (its request was cancelled when the client
    went away): the coordinator carries on with everyone else's replies either way.
    """
    future = asyncio.get_running_loop().create_future()

    def resolve(value: Any) -> None:
        if not future.done():
            future.set_result(value)
    return future, resolve


def authorized(ctx, operation: Operation, resource_type: ResourceType, name: str) -> bool:
    """Kafka's ACL check for the request's principal, asked before a handler acts."""
    return ctx.broker.authorizer.authorize(ctx.principal, operation, Resource(resource_type, name))


def fencing_as_version_says(error: ErrorCode, api_version: int = 0, *, fenced_since: int | None = None) -> ErrorCode:
    """PRODUCER_FENCED as the request's version can say it: before version `fenced_since`
    (None: no version of the API has it) Kafka answers a fenced producer with
    INVALID_PRODUCER_EPOCH."""
    if error is ErrorCode.producer_fenced and (fenced_since is None or api_version < fenced_since):
        return ErrorCode.invalid_producer_epoch
    return error
