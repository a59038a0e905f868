"""WriteTxnMarkers: the transaction coordinator asks a partition leader to end a transaction.

Each marker becomes a COMMIT or ABORT control batch in every listed partition. The log's
producer state checks it (a stale producer epoch is INVALID_PRODUCER_EPOCH, a stale
coordinator epoch TRANSACTION_COORDINATOR_FENCED), then moves the LSO and indexes aborts.
For `__consumer_offsets` the group coordinator is told too: the transaction's offsets become
visible (commit) or are dropped (abort). Admin tools send it as well (KIP-664's abort of a
hanging transaction), which is why the request needs ClusterAction. As in Kafka, the markers
are appended with acks=all: the answer waits until the high watermark has passed them (one
node: at once), so a coordinator completes a transaction only once its markers are safe.

v2 (Kafka 4.x) names each marker's transaction version. A transaction-version-2 coordinator
bumps the producer epoch before it writes the markers, so such a marker must carry an epoch
above the partition's (Kafka's `ProducerAppendInfo.checkProducerEpoch`): an equal epoch is a
retry of a marker already written when no transaction is open, else INVALID_PRODUCER_EPOCH.
Ottla's own coordinator is on transaction version 0 and sends the highest version the leader
serves (its ApiVersions, `coordinator_runtime.py`): v2 between Ottla brokers, stating version 0.
"""

import functools

from ..replies import authorized
from ...errors import ErrorCode
from ...producer_state.authorizer import CLUSTER_NAME, Operation, ResourceType
from ...protocol.build import make, nested
from ...records.control import build_control_batch
from ..clock import now_ms
from ..data_sync import sync_partitions

API_KEY = 27
# v0 (removed in Kafka 4.0, KIP-896) is v1 without tagged fields; v2 carries the transaction version.
VERSIONS = (0, 2)

GROUP_METADATA_TOPIC = "__consumer_offsets"
# Kafka waits for the markers' replication up to its request.timeout.ms default.
_ACK_TIMEOUT_MS = 30_000


async def handle(ctx, request):
    if not authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        return _response(ctx, [(marker.producer_id, [(topic.name, index, ErrorCode.cluster_authorization_failed)
                                                     for topic in marker.topics for index in topic.partition_indexes])
                               for marker in request.markers])
    return await write_markers(ctx, request)


async def write_markers(ctx, request):
    """The request's work without the ACL check: the local coordinator calls it directly.

    A partition is answered once its marker is durable (fdatasynced; on one node that is
    the only copy): the coordinator writes CompleteCommit/CompleteAbort after this answer,
    and a complete transaction whose marker a power loss took would stay open on the
    partition for good.
    """
    broker = ctx.broker
    results = []
    durable = set()
    for marker in request.markers:
        commit = marker.transaction_result
        now = now_ms()
        wanted = [(topic.name, index) for topic in marker.topics for index in topic.partition_indexes]
        batches = {tp: build_control_batch(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                           commit, now) for tp in wanted}
        precheck = None
        if getattr(marker, "transaction_version", 0) >= 2:
            precheck = functools.partial(_check_tv2_epoch, broker, marker.producer_id, marker.producer_epoch)
        appended = await broker.replicas.append_records(batches, acks=-1, timeout_ms=_ACK_TIMEOUT_MS, now_ms=now,
                                                        origin="coordinator", precheck=precheck)
        offsets_partitions = [index for (topic, index) in wanted
                              if topic == GROUP_METADATA_TOPIC and appended[(topic, index)].error == ErrorCode.none]
        if offsets_partitions:
            broker.groups.complete_txn(marker.producer_id, commit, offsets_partitions)
        durable.update(tp for tp in wanted if appended[tp].error == ErrorCode.none)
        results.append((marker.producer_id, [(topic, index, appended[(topic, index)].error) for topic, index in wanted]))
    sync_errors = await sync_partitions(broker.logs, durable)
    if sync_errors:
        results = [(producer_id, [(topic, index, sync_errors.get((topic, index), error))
                                  for topic, index, error in outcomes]) for producer_id, outcomes in results]
    return _response(ctx, results)


def _check_tv2_epoch(broker, producer_id: int, epoch: int, topic: str, index: int, _records):
    """A transaction-version-2 marker's epoch against the partition's producer state, checked
    just before the append (nothing runs between the two)."""
    current = broker.replicas.leader_partition(topic, index).log.producer_state.entry(producer_id)
    if current is None or epoch > current.epoch:
        return None
    if epoch == current.epoch and current.txn_first_offset is None:
        return None  # the retry of a marker already written: the transaction has ended
    return (ErrorCode.invalid_producer_epoch,
            f"Epoch of producer {producer_id} in {topic}-{index} is {epoch}, which is <= the last seen "
            f"epoch {current.epoch} (TV2)")


def _response(ctx, results):
    response_type = ctx.response_type
    marker_type = nested(response_type, "WritableTxnMarkerResult")
    topic_type = nested(response_type, "WritableTxnMarkerTopicResult")
    partition_type = nested(response_type, "WritableTxnMarkerPartitionResult")
    markers = []
    for producer_id, outcomes in results:
        by_topic: dict[str, list] = {}
        for topic, index, error in outcomes:
            by_topic.setdefault(topic, []).append(make(partition_type, partition_index=index, error_code=error))
        markers.append(make(marker_type, producer_id=producer_id, topics=tuple(
            make(topic_type, name=topic, partitions=tuple(partitions)) for topic, partitions in by_topic.items())))
    return make(response_type, markers=tuple(markers))
