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


class _Reads:
    """One Fetch's reads: every partition asked for once; after each wait, for a follower,
    only those the wait says were notified (`DelayedFetches.wait`), in request order.
    Re-reading all of them was O(partitions) per wake-up: a follower's delayed fetch of 333
    partitions re-read them all for each append to any one of them, and for each HW move the
    other follower made, several times per replication round. A consumer's fetch keeps no
    answers while it waits (`release`) and reads all again."""

    __slots__ = ("ctx", "request", "wanted_topics", "response_type", "topic_type", "partition_type",
                 "aborted_type", "epoch_type", "replica_id", "read_committed", "budget", "keeps_answers", "hints",
                 "answers", "total", "failed", "now_ms")

    def __init__(self, ctx, request, wanted_topics, response_type):
        self.ctx = ctx
        self.request = request
        self.wanted_topics = wanted_topics
        self.response_type = response_type
        self.topic_type = nested(response_type, "FetchableTopicResponse")
        self.partition_type = nested(response_type, "PartitionData")
        self.aborted_type = nested(response_type, "AbortedTransaction")
        self.epoch_type = nested(response_type, "EpochEndOffset")
        self.replica_id = _replica_id(request)
        self.read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED and self.replica_id < 0
        self.budget = min(getattr(request, "max_bytes", _NO_LIMIT), ctx.broker.config["fetch.max.bytes"])
        self.keeps_answers = self.replica_id >= 0
        self.hints = LeaderHints(ctx.broker.metadata, response_type)
        self.answers: list[list] | None = None
        self.total = 0
        self.failed = False

    def release(self) -> None:
        self.answers = self.hints = None

    def read_all(self) -> None:
        self._read(None)

    def read_again(self, woken: set) -> None:
        """Re-read after a wait. Before anything was read, only the notified partitions can
        answer differently (every append, HW move, role change and removal notifies); once
        some data was read (min_bytes > 1) the byte budget is shared, and after a timeout
        (nothing notified) anything else may have moved, so then all are read again."""
        self.hints = LeaderHints(self.ctx.broker.metadata, self.response_type)
        if self.total == 0 and woken and self.answers is not None:
            self._read(woken)
        else:
            self.total = 0
            self.failed = False
            self._read(None)

    def _read(self, only: set | None) -> None:
        self.now_ms = int(time.time() * 1000)
        if self.answers is None or only is None:
            self.answers = [[None] * len(partitions) for _, _, partitions in self.wanted_topics]
        remaining = self.budget - self.total
        for t, (topic_name, topic_id, wanted_partitions) in enumerate(self.wanted_topics):
            answers = self.answers[t]
            for i, wanted in enumerate(wanted_partitions):
                if only is not None and (topic_name, wanted.partition) not in only:
                    continue
                answers[i], size = self._read_one(topic_name, topic_id, wanted, remaining)
                remaining -= size
                self.total += size

    def _read_one(self, topic_name, topic_id, wanted, remaining: int):
        """(PartitionData, bytes of records) of one partition; an error sets `failed`."""
        broker = self.ctx.broker
        partition_type = self.partition_type
        try:  # KIP-320: a fetcher with another leader epoch's metadata is told so
            if topic_name is None:
                raise KafkaError(ErrorCode.unknown_topic_id, f"unknown topic id {topic_id}")
            partition = leader_partition_at(broker, topic_name, wanted.partition,
                                            getattr(wanted, "current_leader_epoch", -1), topic_id)
            log = partition.log
        except KafkaError as exc:
            self.failed = True
            return make(partition_type, partition_index=wanted.partition, error_code=exc.code, high_watermark=-1,
                        last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                        preferred_read_replica=-1, records=b"",
                        **self.hints.current_leader(topic_name, wanted.partition, exc.code)), 0
        replica_id = self.replica_id
        high_watermark = log.high_watermark
        stable = log.last_stable_offset
        error, records, aborted, diverging = ErrorCode.none, b"", None, None
        try:
            if wanted.partition_max_bytes < 0:
                # Kafka's log read refuses a negative size (IllegalArgumentException).
                raise KafkaError(ErrorCode.unknown_server_error, "negative partition_max_bytes")
            if (replica_id >= 0 and wanted.fetch_offset == log.log_end_offset
                    and getattr(wanted, "last_fetched_epoch", -1) == log.leader_epoch_cache.latest_epoch):
                # A follower at the log end in the latest epoch (most partitions of every
                # replica fetch): nothing can diverge and nothing is there to read.
                broker.replicas.follower_fetched(topic_name, wanted.partition, replica_id, wanted.fetch_offset,
                                                 self.now_ms)
                return self._answer(wanted.partition, ErrorCode.none, log.high_watermark, stable,
                                    log.log_start_offset, None, b"", None, topic_name), 0
            diverging = _diverging(wanted, partition, self.epoch_type)
            if replica_id >= 0 and diverging is None and wanted.fetch_offset <= log.log_end_offset:
                # Only a fetch that continues the leader's log tells the follower's progress.
                broker.replicas.follower_fetched(topic_name, wanted.partition, replica_id, wanted.fetch_offset,
                                                 self.now_ms)
                high_watermark = log.high_watermark
            if diverging is not None:  # the fetcher must truncate first: answer at once
                self.failed = True
            else:
                data = log.read(
                    wanted.fetch_offset,
                    min(wanted.partition_max_bytes, max(remaining, 0)),
                    max_offset=(log.log_end_offset if replica_id >= 0
                                else stable if self.read_committed else high_watermark),
                    min_one_batch=self.total == 0,
                    with_aborted=self.read_committed,
                    lazy=self.ctx.api_version >= 4,  # older versions are down-converted in memory
                )
                records = data.records
                if self.ctx.api_version < 4:
                    records = down_convert(records, magic=0 if self.ctx.api_version < 2 else 1)
                if self.read_committed:
                    aborted = tuple(make(self.aborted_type, producer_id=txn.producer_id, first_offset=txn.first_offset)
                                    for txn in data.aborted_transactions)
        except KafkaError as exc:
            error = exc.code
            self.failed = True
        return self._answer(wanted.partition, error, high_watermark, stable, log.log_start_offset, aborted,
                            records, diverging, topic_name), len(records)

    def _answer(self, partition: int, error, high_watermark: int, stable: int, log_start_offset: int, aborted,
                records, diverging, topic_name: str):
        return make(self.partition_type, partition_index=partition, error_code=error,
                    high_watermark=high_watermark, last_stable_offset=stable,
                    log_start_offset=log_start_offset, aborted_transactions=aborted,
                    preferred_read_replica=-1, records=records,
                    **({} if diverging is None else {"diverging_epoch": diverging}),
                    **self.hints.current_leader(topic_name, partition, error))

    def topics(self) -> tuple:
        return tuple(make(self.topic_type, topic=topic_name, topic_id=topic_id, partitions=tuple(answers))
                     for (topic_name, topic_id, _), answers in zip(self.wanted_topics, self.answers))


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
    reads = _Reads(ctx, request, wanted, response_type)
    reads.read_all()
    keys = [(name, p.partition) for name, _, partitions in wanted if name is not None for p in partitions]
    while reads.total < request.min_bytes and keys and not reads.failed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        notified = set() if reads.keeps_answers else None
        if notified is None:  # not kept while waiting: a full garbage collection walks every waiting fetch's objects
            reads.release()
        woken = await ctx.broker.replicas.delayed_fetches.wait(keys, remaining, notified)
        reads.read_again(notified if woken else None)
        if not woken:  # max_wait has passed: answered with whatever is there
            break
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, session_id=0,
                responses=reads.topics(), node_endpoints=reads.hints.node_endpoints())
