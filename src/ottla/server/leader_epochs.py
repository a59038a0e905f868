"""The partition a request may be served from, checked against the request's leader epoch
(KIP-320), as Kafka's Partition.getLocalLog does for Fetch, ListOffsets and
OffsetsForLeaderEpoch."""

from __future__ import annotations

from ..errors import ErrorCode, KafkaError
from ..replication.epochs import check_current_leader_epoch


def leader_partition_at(broker, topic: str, partition: int, current_leader_epoch: int, topic_id=None):
    """The leader's `Partition`. Raises UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER
    when it is not here (`ReplicaManager.hosted_partition`), INCONSISTENT_TOPIC_ID when the
    request's `topic_id` (Fetch v13+: resolved to `topic` by the metadata cache) is not the id of
    the local log (the metadata already names a recreated topic whose log this broker has not
    replaced yet; Kafka's ReplicaManager.readFromLog), FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH when the request names an older / newer leader
    epoch than this broker's (-1: no check), then NOT_LEADER_OR_FOLLOWER when this broker does
    not lead it: the epoch comes first, so a client with newer metadata waits instead of
    looking for another leader."""
    found = broker.replicas.hosted_partition(topic, partition)
    local = broker.logs.topics.get(topic)
    if topic_id is not None and local is not None and local.topic_id != topic_id:
        raise KafkaError(ErrorCode.inconsistent_topic_id,
                         "Topic ID in the fetch session did not match the topic ID in the log.")
    error = check_current_leader_epoch(current_leader_epoch, found.leader_epoch)
    if error is not ErrorCode.none:
        raise KafkaError(error, f"request names leader epoch {current_leader_epoch} of {topic}-{partition}, "
                                f"this broker has {found.leader_epoch}")
    found.check_leader()
    return found
