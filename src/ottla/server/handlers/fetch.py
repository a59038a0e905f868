"""Fetch: whole batches served from the segment files, long polling, size limits.

Incremental fetch sessions (KIP-227) are answered the way Kafka answers when its session
cache is full: session id 0, so clients keep sending full fetch requests.

As in Kafka, the partitions asked for become a map (a partition named twice is read once,
with the last entry's offset and size, in the place of its first mention), and the
response holds at most min(request max_bytes, broker `fetch.max.bytes`) beyond the first
batch that must always be returned. Large record sets stay in the segment file until the
socket takes them (`log/file_records.py`), so a consumer that does not read costs one write
slice, not its whole response.

From v13 topics are named by topic id (KIP-516), resolved through the metadata cache; an id
it does not know is UNKNOWN_TOPIC_ID, one that is not the local log's INCONSISTENT_TOPIC_ID,
and the response names topics by id too. From v16 a partition answered NOT_LEADER_OR_FOLLOWER
or FENCED_LEADER_EPOCH names its current leader (KIP-951, `server/leader_hints.py`). v17 and
v18 add two tagged fields a follower may send, its log directory id (KIP-853) and its high
watermark (KIP-1166); both serve KRaft's own replication, consumers never send them, and
Ottla reads neither, so v17-v18 are served as v16.

A Fetch with a replica id >= 0 comes from a follower (up to v14 the id is a top-level field;
v15 moved it into `replica_state`, KIP-903): it reads up to the leader's log end, not the HW,
its fetch offset is the follower's progress the leader's state needs (HW, ISR), and the
answer carries the HW the follower copies. Ottla's own followers send v12
(`server/replica_fetcher.py`).
"""

import time
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ...records.legacy import down_convert
from ...replication.epochs import diverging_epoch
from ..leader_epochs import leader_partition_at
from ..leader_hints import LeaderHints

API_KEY = 1
# v0-v3 expect message format v0 (v0-v1) or v1 (v2-v3): batches are down-converted, as
# Kafka 3.9 did (removed in Kafka 4.0, KIP-896). v3 adds the response size limit.
VERSIONS = (0, 18)
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


def _replica_id(request) -> int:
    """The follower's broker id, or -1 for a consumer: v15+ carry it in `replica_state` (KIP-903)."""
    state = getattr(request, "replica_state", None)
    return state.replica_id if state is not None else getattr(request, "replica_id", -1)


def _distinct_partitions(ctx, request) -> list[tuple[str | None, object, list]]:
    """Kafka's FetchRequest.fetchData (a LinkedHashMap), grouped back into topics the way
    FetchResponse.toMessage does: consecutive partitions of one topic share an entry. Each
    topic is (name, topic id, partitions); v13+ name topics by id, resolved through the
    metadata cache (name None: an id it does not know)."""
    by_id = ctx.api_version >= 13
    wanted = {}
    for topic in request.topics:
        key = topic.topic_id if by_id else topic.topic
        for partition in topic.partitions:
            wanted[(key, partition.partition)] = partition
    grouped: list[tuple[str | None, object, list]] = []
    for (key, _), partition in wanted.items():
        if grouped and grouped[-1][1 if by_id else 0] == key:
            grouped[-1][2].append(partition)
        elif by_id:
            info = ctx.broker.metadata.topic_by_id(key)
            grouped.append((info.name if info is not None else None, key, [partition]))
        else:
            grouped.append((key, None, [partition]))
    return grouped


def _read_partitions(ctx, request, wanted_topics, response_type, hints: LeaderHints):
    broker = ctx.broker
    topic_type = nested(response_type, "FetchableTopicResponse")
    partition_type = nested(response_type, "PartitionData")
    aborted_type = nested(response_type, "AbortedTransaction")
    epoch_type = nested(response_type, "EpochEndOffset")
    replica_id = _replica_id(request)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED and replica_id < 0
    remaining = min(getattr(request, "max_bytes", _NO_LIMIT), broker.config["fetch.max.bytes"])
    total = 0
    failed = False
    topics = []
    for topic_name, topic_id, wanted_partitions in wanted_topics:
        partitions = []
        for wanted in wanted_partitions:
            try:  # KIP-320: a fetcher with another leader epoch's metadata is told so
                if topic_name is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"unknown topic id {topic_id}")
                partition = leader_partition_at(broker, topic_name, wanted.partition,
                                                getattr(wanted, "current_leader_epoch", -1), topic_id)
                log = partition.log
            except KafkaError as exc:
                partitions.append(make(partition_type, partition_index=wanted.partition,
                                       error_code=exc.code, high_watermark=-1,
                                       last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                       preferred_read_replica=-1, records=b"",
                                       **hints.current_leader(topic_name, wanted.partition, exc.code)))
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
                                   **({} if diverging is None else {"diverging_epoch": diverging}),
                                   **hints.current_leader(topic_name, wanted.partition, error)))
        topics.append(make(topic_type, topic=topic_name, topic_id=topic_id, partitions=tuple(partitions)))
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
    wanted = _distinct_partitions(ctx, request)
    hints = LeaderHints(ctx.broker.metadata, response_type)
    topics, total, failed = _read_partitions(ctx, request, wanted, response_type, hints)
    keys = [(name, p.partition) for name, _, partitions in wanted if name is not None for p in partitions]
    while total < request.min_bytes and keys and not failed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # Not kept while waiting: a full garbage collection walks every waiting fetch's objects.
        topics = hints = None
        woken = await ctx.broker.replicas.delayed_fetches.wait(keys, remaining)
        hints = LeaderHints(ctx.broker.metadata, response_type)
        topics, total, failed = _read_partitions(ctx, request, wanted, response_type, hints)
        if not woken:  # max_wait has passed: answered with whatever is there
            break
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, session_id=0,
                responses=tuple(topics), node_endpoints=hints.node_endpoints())
