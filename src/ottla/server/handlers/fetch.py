"""Fetch: whole batches served from the segment files, long polling, size limits.

Incremental fetch sessions (KIP-227) are answered the way Kafka answers when its session
cache is full: session id 0, so clients keep sending full fetch requests.

As in Kafka, the partitions asked for become a map (a partition named twice is read once,
with the last entry's offset and size, in the place of its first mention), and the
response holds at most min(request max_bytes, broker `fetch.max.bytes`) beyond the first
batch that must always be returned. Large record sets stay in the segment file until the
socket takes them (`log/file_records.py`), so a consumer that does not read costs one write
slice, not its whole response.

A Fetch with `replica_id` >= 0 comes from a follower (up to v12 the id is a top-level field;
v15 moved it into `replica_state`, which Ottla does not serve yet): it reads up to the
leader's log end, not the HW, its fetch offset is the follower's progress the leader's
state needs (HW, ISR), and the answer carries the HW the follower copies.
"""

import time
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ...records.legacy import down_convert
from ...replication.epochs import diverging_epoch
from ..leader_epochs import leader_partition_at

API_KEY = 1
# v0-v3 expect message format v0 (v0-v1) or v1 (v2-v3): batches are down-converted, as
# Kafka 3.9 did (removed in Kafka 4.0, KIP-896). v3 adds the response size limit.
VERSIONS = (0, 12)
_NO_LIMIT = 0x7FFFFFFF

READ_COMMITTED = 1


def _diverging(wanted, partition, epoch_type):
    """KIP-595's diverging epoch for a Fetch v12+ carrying last_fetched_epoch, as the
    response's EpochEndOffset, or None."""
    last_fetched = getattr(wanted, "last_fetched_epoch", -1)
    if last_fetched < 0:
        return None
    found = diverging_epoch(partition.log, partition.leader_epoch, last_fetched, wanted.fetch_offset)
    return None if found is None else make(epoch_type, epoch=found.leader_epoch, end_offset=found.end_offset)


def _distinct_partitions(request) -> list[tuple[str, list]]:
    """Kafka's FetchRequest.fetchData (a LinkedHashMap), grouped back into topics the way
    FetchResponse.toMessage does: consecutive partitions of one topic share an entry."""
    wanted = {}
    for topic in request.topics:
        for partition in topic.partitions:
            wanted[(topic.topic, partition.partition)] = partition
    grouped: list[tuple[str, list]] = []
    for (name, _), partition in wanted.items():
        if grouped and grouped[-1][0] == name:
            grouped[-1][1].append(partition)
        else:
            grouped.append((name, [partition]))
    return grouped


def _read_partitions(ctx, request, wanted_topics, response_type):
    broker = ctx.broker
    topic_type = nested(response_type, "FetchableTopicResponse")
    partition_type = nested(response_type, "PartitionData")
    aborted_type = nested(response_type, "AbortedTransaction")
    epoch_type = nested(response_type, "EpochEndOffset")
    replica_id = getattr(request, "replica_id", -1)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED and replica_id < 0
    remaining = min(getattr(request, "max_bytes", _NO_LIMIT), broker.config["fetch.max.bytes"])
    total = 0
    failed = False
    topics = []
    for topic_name, wanted_partitions in wanted_topics:
        partitions = []
        for wanted in wanted_partitions:
            try:  # KIP-320: a fetcher with another leader epoch's metadata is told so
                partition = leader_partition_at(broker, topic_name, wanted.partition,
                                                getattr(wanted, "current_leader_epoch", -1))
                log = partition.log
            except KafkaError as exc:
                partitions.append(make(partition_type, partition_index=wanted.partition,
                                       error_code=exc.code, high_watermark=-1,
                                       last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                       preferred_read_replica=-1, records=None))
                failed = True
                continue
            high_watermark = log.high_watermark
            stable = log.last_stable_offset
            error, records, aborted, diverging = ErrorCode.none, b"", None, None
            try:
                if wanted.partition_max_bytes < 0:
                    # Kafka's log read refuses a negative size (IllegalArgumentException).
                    raise KafkaError(ErrorCode.unknown_server_error, "negative partition_max_bytes")
                diverging = _diverging(wanted, partition, epoch_type)
                if replica_id >= 0 and diverging is None and wanted.fetch_offset <= log.log_end_offset:
                    # Only a fetch that continues the leader's log tells the follower's progress.
                    broker.replicas.follower_fetched(topic_name, wanted.partition, replica_id, wanted.fetch_offset,
                                                     int(time.time() * 1000))
                    high_watermark = log.high_watermark
                if diverging is not None:  # the fetcher must truncate first: answer at once
                    failed = True
                else:
                    data = log.read(
                        wanted.fetch_offset,
                        min(wanted.partition_max_bytes, max(remaining, 0)),
                        max_offset=(log.log_end_offset if replica_id >= 0
                                    else stable if read_committed else high_watermark),
                        min_one_batch=total == 0,
                        with_aborted=read_committed,
                        lazy=ctx.api_version >= 4,  # older versions are down-converted in memory
                    )
                    records = data.records
                    if ctx.api_version < 4:
                        records = down_convert(records, magic=0 if ctx.api_version < 2 else 1)
                    if read_committed:
                        aborted = tuple(make(aborted_type, producer_id=txn.producer_id, first_offset=txn.first_offset)
                                        for txn in data.aborted_transactions)
            except KafkaError as exc:
                error = exc.code
                failed = True
            remaining -= len(records)
            total += len(records)
            partitions.append(make(partition_type, partition_index=wanted.partition, error_code=error,
                                   high_watermark=high_watermark, last_stable_offset=stable,
                                   log_start_offset=log.log_start_offset, aborted_transactions=aborted,
                                   preferred_read_replica=-1, records=records,
                                   **({} if diverging is None else {"diverging_epoch": diverging})))
        topics.append(make(topic_type, topic=topic_name, partitions=tuple(partitions)))
    return topics, total, failed


async def handle(ctx, request):
    response_type = ctx.response_type
    session_error = ErrorCode.none
    if getattr(request, "session_id", 0) != 0:
        session_error = ErrorCode.fetch_session_id_not_found
    if session_error != ErrorCode.none:
        return make(response_type, throttle_time=timedelta(0), error_code=session_error, session_id=0, responses=())
    wait_s = request.max_wait.total_seconds()
    deadline = time.monotonic() + wait_s
    wanted = _distinct_partitions(request)
    topics, total, failed = _read_partitions(ctx, request, wanted, response_type)
    keys = [(name, p.partition) for name, partitions in wanted for p in partitions]
    while total < request.min_bytes and keys and not failed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await ctx.broker.replicas.wait_for_data(keys, remaining)
        topics, total, failed = _read_partitions(ctx, request, wanted, response_type)
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, session_id=0,
                responses=tuple(topics))
