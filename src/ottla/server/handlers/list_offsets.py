"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3) and by timestamp.

The tiered-storage specs are answered as Kafka answers them for a topic without remote
storage (Ottla has none): earliest local (-4, v8+, KIP-405) is the earliest offset, latest
tiered (-5, v9+, KIP-1005) and earliest pending upload (-6, v11+, KIP-1023) are offset -1 with
no timestamp or epoch (`UnifiedLog.fetchOffsetByTimestamp`). A negative timestamp that is no
spec, or a spec the request's version predates, is UNSUPPORTED_VERSION for that partition
(Kafka's `timestampMinSupportedVersion`). v10's `timeout_ms` bounds remote lookups only.

Each answer carries the leader epoch of the offset it names (the current epoch for latest),
and a request naming another current leader epoch is fenced (KIP-320). A follower (replica
id >= 0) resetting its fetch offset gets the leader's log end as latest, as in Kafka.

A new leader whose HW is still below the start offset of its epoch (its followers have not
fetched yet) would answer an older HW than the previous leader did, so offsets seen by
clients would go backwards after a failover. Until the HW reaches the epoch start, a client
(replica id -1, v1+) asking for latest, or for a time whose record is not below the HW, gets
OFFSET_NOT_AVAILABLE (v5+; LEADER_NOT_AVAILABLE before v5), both retriable; earliest is
answered (KIP-207, Kafka's Partition.fetchOffsetForTimestamp)."""

import asyncio
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ..leader_epochs import leader_partition_at
from ..steps import producer_state_ready

API_KEY = 2
# v0 (removed in Kafka 4.0, KIP-896) answers a list of offsets ("old style") instead of one.
VERSIONS = (0, 11)

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD = -4, -5, -6
READ_COMMITTED = 1
CONSUMER_REPLICA_ID = -1  # a client; -2 is Kafka's debugging replica id, >= 0 a follower
# Specs answered without the LSO (latest, max timestamp and times are answered below it read_committed).
_NO_LSO_NEEDED = (EARLIEST, EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD)
# The first version that may ask for each spec (Kafka 3.9 served v0 apart: latest and earliest only).
_SPEC_MIN_VERSION = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9,
                     EARLIEST_PENDING_UPLOAD: 11}


def _unsupported(timestamp: int, version: int) -> bool:
    return timestamp < 0 and (timestamp not in _SPEC_MIN_VERSION or version < _SPEC_MIN_VERSION[timestamp])


def _lookup(log, timestamp: int, read_committed: bool, from_replica: bool,
            not_monotonic: KafkaError | None = None) -> tuple[int, int]:
    """(offset, timestamp) as Kafka answers; (-1, -1) when no record has a timestamp that late.
    A client is answered only from below what it may fetch (the LSO read_committed, else the
    HW; a replica, the log end), Kafka's `lastFetchableOffset`: no lookup by time positions a
    consumer past the HW or inside a transaction that may still abort. `not_monotonic` is
    raised instead of answering latest, or instead of "none that late", while this new
    leader's HW lags the start of its epoch (`_hw_behind_epoch_start`)."""
    if timestamp in (EARLIEST, EARLIEST_LOCAL):  # no remote storage: the local log is all there is
        return log.log_start_offset, -1
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):  # nothing tiered, nothing pending
        return -1, -1
    if from_replica:
        fetchable = log.log_end_offset
    else:
        fetchable = log.last_stable_offset if read_committed else log.high_watermark
    if timestamp == LATEST:
        if not_monotonic is not None:
            raise not_monotonic
        return fetchable, -1
    found = log.max_timestamp_offset() if timestamp == MAX_TIMESTAMP else log.offset_for_timestamp(timestamp)
    if found is not None and found.offset < fetchable:
        return found
    if not_monotonic is not None:
        raise not_monotonic
    return -1, -1


def _hw_behind_epoch_start(partition, version: int, replica_id: int) -> KafkaError | None:
    """The error a client gets while this leader's HW is below the start offset of its leader
    epoch (KIP-207): latest would be older than what the previous leader answered. Only client
    requests of v1+ (Kafka answers v0 from the legacy path without this check); before v5,
    which added OFFSET_NOT_AVAILABLE, Kafka answers LEADER_NOT_AVAILABLE."""
    state = partition.leader_state
    if version < 1 or replica_id != CONSUMER_REPLICA_ID or state is None:
        return None
    hw = partition.log.high_watermark
    if state.epoch_start_offset <= hw:
        return None
    code = ErrorCode.offset_not_available if version >= 5 else ErrorCode.leader_not_available
    return KafkaError(code, f"{partition.topic}-{partition.index} at leader epoch {partition.leader_epoch}: "
                            f"high watermark {hw} is behind the epoch start offset {state.epoch_start_offset}")


def _epoch_of(partition, timestamp: int, offset: int) -> int:
    """Kafka's answer: the current epoch for latest, else the epoch whose leader wrote `offset`
    (-1 when no offset was found)."""
    if offset < 0:
        return -1
    if timestamp == LATEST:
        return partition.leader_epoch
    epoch = partition.log.leader_epoch_cache.epoch_for_offset(offset)
    return partition.leader_epoch if epoch is None else epoch  # nothing written since this leader's election


def _old_style(log, wanted, offset: int) -> tuple[int, ...]:
    """ListOffsets v0's answer: up to max_num_offsets offsets, newest first; for the latest
    offset Kafka also lists the log start, the only other segment boundary clients rely on."""
    if log is None or offset < 0:
        return ()
    found = [offset]
    if wanted.timestamp == LATEST and log.log_start_offset != offset:
        found.append(log.log_start_offset)
    return tuple(found[:max(getattr(wanted, "max_num_offsets", 1), 0)])


_YIELD_EVERY = 256  # partitions answered per step (2,000 partitions held the loop 68 ms)


async def handle(ctx, request):
    response_type = ctx.response_type
    topic_type = nested(response_type, "ListOffsetsTopicResponse")
    partition_type = nested(response_type, "ListOffsetsPartitionResponse")
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    answered = 0
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            answered += 1
            if answered % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a request naming every partition: other connections go between
            error, offset, timestamp, leader_epoch = ErrorCode.none, -1, -1, -1
            partition_log = None
            try:
                if _unsupported(wanted.timestamp, ctx.api_version):
                    raise KafkaError(ErrorCode.unsupported_version)
                partition = leader_partition_at(ctx.broker, topic.name, wanted.partition_index,
                                                getattr(wanted, "current_leader_epoch", -1))
                if (read_committed and wanted.timestamp not in _NO_LSO_NEEDED
                        and not partition.log.producer_state_ready):
                    await producer_state_ready(partition.log)  # the LSO needs it: loaded in steps
                    partition = leader_partition_at(ctx.broker, topic.name, wanted.partition_index,
                                                    getattr(wanted, "current_leader_epoch", -1))
                partition_log = partition.log
                replica_id = getattr(request, "replica_id", CONSUMER_REPLICA_ID)
                offset, timestamp = _lookup(partition.log, wanted.timestamp, read_committed, replica_id >= 0,
                                            _hw_behind_epoch_start(partition, ctx.api_version, replica_id))
                leader_epoch = _epoch_of(partition, wanted.timestamp, offset)
            except KafkaError as exc:
                error = exc.code
            partitions.append(make(partition_type, partition_index=wanted.partition_index, error_code=error,
                                   timestamp=timestamp, offset=offset, leader_epoch=leader_epoch,
                                   old_style_offsets=_old_style(partition_log, wanted, offset)))
        topics.append(make(topic_type, name=topic.name, partitions=tuple(partitions)))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(topics))
