"""Metadata: brokers, topics (with ids) and partition leaders, from the metadata cache;
auto-creates topics when allowed.

Each topic's part of the answer is built and encoded once per change of the metadata cache
and per version (`MetadataCache.derived`), then reused: an all-topics request for 1,000
partitions built 1,000 entities and encoded them field by field every time.

Each auto-created topic, and every `_YIELD_EVERY` topics of the answer, is a step of its own:
the loop serves other connections in between (a request naming thousands of topics held it
for seconds).
"""

import asyncio
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...producer_state.authorizer import CLUSTER_NAME, ResourceType
from ...protocol.build import make, nested
from ...protocol.codec import Encoded, encode_item
from .. import cluster_admin
from ..replies import NOT_REQUESTED, authorized_operations

API_KEY = 3
VERSIONS = (0, 13)  # v13: a top-level error code (KIP-1102), set only on a whole-request error

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
_YIELD_EVERY = 256


def _requested_names(ctx, request) -> list[str] | None:
    """Topic names asked for, or None for all topics (v0 uses an empty list for that)."""
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        return None
    names = []
    for topic in request.topics:
        name = getattr(topic, "name", None)
        if name is None and getattr(topic, "topic_id", None) is not None:
            info = ctx.broker.metadata.topic_by_id(topic.topic_id)
            name = info.name if info else None
        names.append(name)
    return names


def _invalid_topics(ctx, request) -> bool:
    """v10 and v11 carry topic ids but may not use them (Kafka: "Topic name can not be null")."""
    return 10 <= ctx.api_version < 12 and request.topics is not None and any(
        topic.name is None or topic.topic_id is not None for topic in request.topics)


def _error_response(ctx, request, error):
    """Kafka's MetadataRequest.getErrorResponse: every requested topic with the error, "" for no name."""
    topic_type = nested(ctx.response_type, "MetadataResponseTopic")
    topics = tuple(make(topic_type, error_code=error, name=topic.name or "", topic_id=topic.topic_id,
                        is_internal=False, partitions=(), topic_authorized_operations=-2147483648)
                   for topic in request.topics or ())
    return make(ctx.response_type, throttle_time=timedelta(0), brokers=(), cluster_id=None, controller_id=-1,
                topics=topics, cluster_authorized_operations=-2147483648, error_code=error)


def _topic(metadata, info, topic_type, operations):
    partition_type = nested(topic_type, "MetadataResponsePartition")
    partitions = tuple(
        make(partition_type, error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
             partition_index=index, leader_id=leader, leader_epoch=state.leader_epoch,
             replica_nodes=state.replicas, isr_nodes=state.isr, offline_replicas=state.offline_replicas)
        for index, state, leader in ((i, s, metadata.alive_leader(s)) for i, s in sorted(info.partitions.items()))
    )
    return make(topic_type, error_code=ErrorCode.none, name=info.name, topic_id=info.topic_id,
                is_internal=info.name in INTERNAL_TOPICS, partitions=partitions,
                topic_authorized_operations=operations)


async def handle(ctx, request):
    broker = ctx.broker
    metadata = broker.metadata
    response_type = ctx.response_type
    if _invalid_topics(ctx, request):
        return _error_response(ctx, request, ErrorCode.invalid_request)
    broker_type = nested(response_type, "MetadataResponseBroker")
    topic_type = nested(response_type, "MetadataResponseTopic")
    names = _requested_names(ctx, request)
    allow_create = getattr(request, "allow_auto_topic_creation", True) and broker.config["auto.create.topics.enable"]

    include_topic_ops = getattr(request, "include_topic_authorized_operations", False)
    topics = []
    for count, name in enumerate(names if names is not None else metadata.topic_names(), 1):
        if count % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        error = ErrorCode.none
        info = metadata.topic(name) if name is not None else None
        if info is None and name is not None and allow_create and name not in INTERNAL_TOPICS \
                and broker.membership is not None:
            error = await cluster_admin.auto_create_topic(broker, name)  # the controller creates it
        elif info is None and name is not None and allow_create and name not in INTERNAL_TOPICS:
            try:
                await broker.create_topic_in_worker(name, broker.config["num.partitions"], {})
                info = metadata.topic(name)
            except KafkaError as exc:
                error = exc.code
        if info is None and names is None:
            continue  # deleted while an earlier step yielded: an all-topics answer leaves it out
        if info is None:
            topics.append(encode_item(make(
                topic_type, error_code=error if error != ErrorCode.none else ErrorCode.unknown_topic_or_partition,
                name=name, topic_id=None, is_internal=False, partitions=(), topic_authorized_operations=NOT_REQUESTED)))
            continue
        operations = authorized_operations(ctx, ResourceType.TOPIC, info.name, include_topic_ops)
        topics.append(metadata.derived((API_KEY, ctx.api_version, info.name, operations),
                                       lambda: encode_item(_topic(metadata, info, topic_type, operations))))
    return make(
        response_type,
        throttle_time=timedelta(0),
        brokers=tuple(make(broker_type, node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                      for b in metadata.brokers),
        cluster_id=metadata.cluster_id,
        controller_id=metadata.controller_id,
        topics=Encoded(topics),
        cluster_authorized_operations=authorized_operations(
            ctx, ResourceType.CLUSTER, CLUSTER_NAME, getattr(request, "include_cluster_authorized_operations", False)),
        error_code=ErrorCode.none,
    )
