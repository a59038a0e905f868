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


# Kafka's AclOperation codes, and the operations each resource type has (AclEntry.supportedOperations).
_OPERATION_CODES = {
    Operation.READ: 3, Operation.WRITE: 4, Operation.CREATE: 5, Operation.DELETE: 6, Operation.ALTER: 7,
    Operation.DESCRIBE: 8, Operation.CLUSTER_ACTION: 9, Operation.DESCRIBE_CONFIGS: 10,
    Operation.ALTER_CONFIGS: 11, Operation.IDEMPOTENT_WRITE: 12,
}
_SUPPORTED_OPERATIONS = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}
NOT_REQUESTED = -2147483648  # what Kafka answers when authorized operations were not asked for


def authorized_operations(ctx, resource_type: ResourceType, name: str, requested: bool) -> int:
    """The include_*_authorized_operations answer: one bit per operation code the principal
    may perform on the resource (Kafka's to32BitField); every supported one without ACLs."""
    if not requested:
        return NOT_REQUESTED
    bits = 0
    for operation in _SUPPORTED_OPERATIONS[resource_type]:
        if authorized(ctx, operation, resource_type, name):
            bits |= 1 << _OPERATION_CODES[operation]
    return bits
