"""FindCoordinator: the leader of the internal-topic partition that owns the key (Kafka's
hash), from the metadata cache; COORDINATOR_NOT_AVAILABLE while that partition has none.
In a cluster the first request for a missing internal topic creates it through the store
(Kafka's auto-creation of `__consumer_offsets` / `__transaction_state`); the client retries
until the controller has elected the leaders."""

from datetime import timedelta

from ..replies import authorized
from ...coordinator.group.records import OFFSETS_TOPIC
from ...coordinator.partitioning import partition_for
from ...coordinator.transaction.log_format import TRANSACTION_STATE_TOPIC
from ...errors import ErrorCode, KafkaError
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested

API_KEY = 10
# v4 batches the keys (KIP-699); v6 adds share-group keys (type 2), which are not served.
VERSIONS = (0, 6)

GROUP, TRANSACTION = 0, 1
_RESOURCES = {
    GROUP: (ResourceType.GROUP, ErrorCode.group_authorization_failed),
    TRANSACTION: (ResourceType.TRANSACTIONAL_ID, ErrorCode.transactional_id_authorization_failed),
}


async def _answer(ctx, key_type: int, key: str) -> dict:
    if key_type not in _RESOURCES:
        error, message = ErrorCode.invalid_request, f"unsupported key type {key_type}"
    elif not authorized(ctx, Operation.DESCRIBE, _RESOURCES[key_type][0], key):
        error, message = _RESOURCES[key_type][1], None
    else:
        metadata = ctx.broker.metadata
        topic = OFFSETS_TOPIC if key_type == GROUP else TRANSACTION_STATE_TOPIC
        info = metadata.topic(topic)
        if info is None and ctx.broker.membership is not None:
            try:
                await ctx.broker.coordinator_runtime.create_internal_topic(topic)
            except KafkaError as exc:
                return dict(error_code=ErrorCode.coordinator_not_available, error_message=exc.message,
                            node_id=-1, host="", port=-1)
        partition = partition_for(key, info.partition_count) if info is not None else -1
        leader = metadata.leader(topic, partition)
        if leader is not None:
            return dict(error_code=ErrorCode.none, error_message=None, node_id=leader.node_id,
                        host=leader.host, port=leader.port)
        error, message = ErrorCode.coordinator_not_available, f"{topic}-{partition} has no leader"
    return dict(error_code=error, error_message=message, node_id=-1, host="", port=-1)


async def handle(ctx, request):
    response_type = ctx.response_type
    key_type = getattr(request, "key_type", GROUP)
    if ctx.api_version >= 4:
        coordinator_type = nested(response_type, "Coordinator")
        coordinators = [make(coordinator_type, key=key, **await _answer(ctx, key_type, key))
                        for key in request.coordinator_keys]
        return make(response_type, throttle_time=timedelta(0), coordinators=tuple(coordinators))
    return make(response_type, throttle_time=timedelta(0), **await _answer(ctx, key_type, request.key))
