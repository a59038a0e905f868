"""TxnOffsetCommit: offsets written inside the producer's transaction, visible to the group
only once the COMMIT marker lands in `__consumer_offsets` (dropped on ABORT).

Before staging them, the transaction coordinator confirms that the group's offsets partition
is part of this producer's ongoing transaction (KIP-890 part 1): a late or stray request would
otherwise open a transaction in `__consumer_offsets` that nothing ever ends. v5 is
transactions version 2 (KIP-890 part 2): the client sends no AddOffsetsToTxn, and the
coordinator adds the partition here instead (served while `transaction.version` is 2).
"""

from datetime import timedelta

from ...coordinator.group import OffsetCommit
from .. import txn_verification
from ..replies import authorized, fencing_as_version_says, reply_future
from ...errors import ErrorCode
from ...producer_state.authorizer import Operation, ResourceType
from ...protocol.build import make, nested
from ..clock import now_ms

API_KEY = 28
# v3 added member and generation (KIP-447); v5 is the transactions v2 flavour.
VERSIONS = (0, 5)
FIRST_TV2_VERSION = 5

GROUP_METADATA_TOPIC = "__consumer_offsets"


async def handle(ctx, request):
    broker = ctx.broker
    groups = broker.groups.coordinator
    wanted = {(t.name, p.partition_index): p for t in request.topics for p in t.partitions}
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        errors = {tp: ErrorCode.transactional_id_authorization_failed for tp in wanted}
    elif not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        errors = {tp: ErrorCode.group_authorization_failed for tp in wanted}
    else:
        errors = {tp: ErrorCode.topic_authorization_failed for tp in wanted
                  if not authorized(ctx, Operation.READ, ResourceType.TOPIC, tp[0])}
        errors.update({tp: ErrorCode.unknown_topic_or_partition for tp in wanted
                       if tp not in errors and broker.metadata.partition(*tp) is None})
        offsets = {tp: OffsetCommit(p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
                   for tp, p in wanted.items() if tp not in errors}
        if offsets:
            errors.update(await _commit(ctx, request, groups, offsets))

    response_type = ctx.response_type
    topic_type = nested(response_type, "TxnOffsetCommitResponseTopic")
    partition_type = nested(response_type, "TxnOffsetCommitResponsePartition")
    by_topic: dict[str, list] = {}
    for (topic, partition) in wanted:
        by_topic.setdefault(topic, []).append(make(partition_type, partition_index=partition,
                                                   error_code=errors[topic, partition]))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(
        make(topic_type, name=topic, partitions=tuple(results)) for topic, results in by_topic.items()))


async def _commit(ctx, request, groups, offsets):
    offsets_partition = (GROUP_METADATA_TOPIC, groups.partition_for(request.group_id))
    verified = await txn_verification.verify(
        ctx.broker, request.transactional_id, request.producer_id, request.producer_epoch, [offsets_partition],
        add=ctx.api_version >= FIRST_TV2_VERSION)
    error = verified[offsets_partition]
    if error is not ErrorCode.none:
        error = fencing_as_version_says(error)
        return {tp: error for tp in offsets}
    future, respond = reply_future()
    groups.txn_offset_commit(
        group_id=request.group_id, producer_id=request.producer_id, producer_epoch=request.producer_epoch,
        member_id=getattr(request, "member_id", ""), group_instance_id=getattr(request, "group_instance_id", None),
        generation_id=getattr(request, "generation_id", -1), offsets=offsets, now_ms=now_ms(), on_complete=respond)
    return await future
