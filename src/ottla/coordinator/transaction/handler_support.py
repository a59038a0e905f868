"""What the transaction request handlers share: awaiting the coordinator's callbacks, and
asking the authorizer in Kafka's terms."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ...producer_state.authorizer import Operation, Resource, ResourceType


def answer_later() -> tuple[asyncio.Future, Callable[[Any], None]]:
    """A future and the callback that resolves it, for the coordinator's `respond` arguments.

    The callback ignores a future that is already done (its request was cancelled when the
    connection closed): the coordinator must carry on with the rest of its work either way.
    """
    future = asyncio.get_running_loop().create_future()

    def resolve(value: Any) -> None:
        if not future.done():
            future.set_result(value)
    return future, resolve


def authorized(ctx, operation: Operation, resource_type: ResourceType, name: str) -> bool:
    """Kafka's ACL check for the request's principal; handlers ask before acting."""
    return ctx.broker.authorizer.authorize(ctx.principal, operation, Resource(resource_type, name))
