"""LeaderAndIsr: the controller tells this broker its role for each partition it replicates."""

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested

API_KEY = 4
VERSIONS = (5, 7)  # topic ids and per-topic errors; the controller sends v7


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "LeaderAndIsrTopicError")
    error_type = nested(response_type, "LeaderAndIsrPartitionError")
    link = ctx.broker.controller_link
    if link is None:  # a single node has no controller: nothing may change its roles
        return make(response_type, error_code=ErrorCode.stale_controller_epoch, topics=())
    try:
        errors = await link.leader_and_isr(request)
    except KafkaError as exc:
        return make(response_type, error_code=exc.code, topics=())
    ids = {t.topic_name: t.topic_id for t in request.topic_states}
    by_topic: dict[str, list] = {}
    for (topic, partition), error in sorted(errors.items()):
        by_topic.setdefault(topic, []).append(make(error_type, partition_index=partition, error_code=error))
    return make(response_type, error_code=ErrorCode.none, topics=tuple(
        make(topic_type, topic_id=ids.get(topic), partition_errors=tuple(parts)) for topic, parts in by_topic.items()))
