"""Fetch: whole batches served from the segment files, long polling, size limits.

Incremental fetch sessions (KIP-227, v7+): the request's session id and epoch pick a context
(`fetch_sessions.new_context`): a full fetch (epoch 0 creates a session, -1 does not), an
incremental one (every partition of the session is read, with the cached position of those
the request leaves out; the response names only those with something new), or a session
error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR
for a session made by name used by id or the reverse) answered with no partitions.

As in Kafka, the partitions asked for become a map (a partition named twice is read once,
with the last entry's offset and size, in the place of its first mention), and the
response holds at most min(request max_bytes, broker `fetch.max.bytes`) beyond the first
batch that must always be returned. Large record sets stay in the segment file until the
socket takes them (`log/file_records.py`), so a consumer that does not read costs one write
slice, not its whole response; for v0-3 they are down-converted a group at a time as they
are sent (`records/legacy.LazyDownConversion`).

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

import asyncio
import time
import uuid
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...fetch_sessions import (FINAL_EPOCH, INVALID_SESSION_ID, FullFetch, IncrementalFetch, entry, new_context,
                               release_retired)
from ...log.file_records import RecordsGone
from ...protocol.build import make, nested
from ...protocol.codec import EncodedBody, encode_item
from ...records.legacy import down_converted
from ...replication.epochs import diverging_epoch
from ..clock import now_ms
from ..leader_epochs import leader_partition_at
from ..leader_hints import LeaderHints
from ..steps import Steps, producer_state_ready

API_KEY = 1
# v0-v3 expect message format v0 (v0-v1) or v1 (v2-v3): batches are down-converted, as
# Kafka 3.9 did (removed in Kafka 4.0, KIP-896). v3 adds the response size limit.
VERSIONS = (0, 18)
_NO_LIMIT = 0x7FFFFFFF

READ_COMMITTED = 1
# Encoded answers with no records in them, by what they say (`_encoded_if_empty`); cleared
# when full, so it holds what idle fetchers currently ask, whatever comes and goes. Full is
# a count of bytes (each answer's body, and its key at about 200 bytes a partition: a tuple
# and its ints): a consumer's answer for 1,000 partitions is some 37 KB and its key 200 KB.
_EMPTY_ANSWERS: dict[tuple, EncodedBody] = {}
_EMPTY_ANSWERS_BYTES = 8 << 20
_KEY_BYTES_PER_PARTITION = 200
_empty_answers_held = [0]
# An empty answer naming more partitions is not kept: encoded on the loop it would hold it
# (a caught-up fetch of 200,000 partitions); the network encodes it in a worker thread.
_EMPTY_ANSWER_MAX_PARTITIONS = 2_000
# What a handler's answer was made from is let go in steps only beyond this many entries (`_let_go`).
_LET_GO_AT_ONCE = 4_096
# Partitions an incremental answer leaves out, walked per step of `Steps` (`_response_topics`).
_SKIPS_PER_STEP = 16


def _diverging(last_fetched: int, fetch_offset: int, partition, epoch_type):
    """KIP-595's diverging epoch for a Fetch v12+ carrying last_fetched_epoch, as the
    response's EpochEndOffset, or None."""
    if last_fetched < 0:
        return None
    found = diverging_epoch(partition.log, partition.leader_epoch, last_fetched, fetch_offset)
    return None if found is None else make(epoch_type, epoch=found.leader_epoch, end_offset=found.end_offset)


def _replica_id(request) -> int:
    """The follower's broker id, or -1 for a consumer: v15+ carry it in `replica_state` (KIP-903)."""
    state = getattr(request, "replica_state", None)
    return state.replica_id if state is not None else getattr(request, "replica_id", -1)


def _id_key(topic_id: uuid.UUID | None) -> int | None:
    """A topic id as a session keys it: its int. A `uuid.UUID` is an object the cyclic collector
    always tracks, and so would be every (id, partition) key of a v13+ session holding it: a
    live session of 200,000 partitions added 200,000 objects to each full collection's walk."""
    return None if topic_id is None else topic_id.int


async def _requested(ctx, request, steps: Steps) -> tuple[dict, list]:
    """Kafka's FetchRequest.fetchData, a LinkedHashMap (a partition named twice keeps its first
    place and its last parameters), and forgottenTopics, keyed by (topic, partition): the topic's
    name, or from v13 its id (`_id_key`)."""
    by_id = ctx.api_version >= 13
    wanted = {}
    for topic in request.topics:
        topic_key = _id_key(topic.topic_id) if by_id else topic.topic
        for partition in topic.partitions:
            await steps.one()
            wanted[(topic_key, partition.partition)] = partition
    forgotten = tuple((_id_key(topic.topic_id) if by_id else topic.topic, partition)
                      for topic in getattr(request, "forgotten_topics_data", ()) for partition in topic.partitions)
    return wanted, forgotten


async def _grouped(ctx, partitions, steps: Steps) -> tuple[list[tuple[str | None, object, list]], dict]:
    """The partitions to read grouped back into topics the way FetchResponse.toMessage does:
    consecutive partitions of one topic share an entry. Each topic is (name, topic id,
    [parameters]); by id (v13+) the name comes from the metadata cache (None: an id it does
    not know). Kept while the fetch waits: no more objects than it needs, and none the cyclic
    collector keeps tracking (a full collection walks every waiting fetch's objects): each
    partition's parameters are a plain tuple of ints (`fetch_sessions.entry`; an incremental
    fetch's are its session's own). Also the (name, partition) keys a wait watches."""
    by_id = ctx.api_version >= 13
    grouped: list[tuple[str | None, object, list]] = []
    last = _NO_TOPIC
    for key, wanted in partitions:
        await steps.one()
        topic = key[0]
        if type(wanted) is not tuple:  # the request's own (a full fetch, sessionless)
            wanted = entry(key[1], wanted)
        if topic == last:
            grouped[-1][2].append(wanted)
        elif by_id:
            topic_id = None if topic is None else uuid.UUID(int=topic)
            info = ctx.broker.metadata.topic_by_id(topic_id)
            grouped.append((info.name if info is not None else None, topic_id, [wanted]))
        else:
            grouped.append((topic, None, [wanted]))
        last = topic
    keys = {}  # an ordered set
    for name, _, wanted_partitions in grouped:
        if name is not None:
            for p in wanted_partitions:
                await steps.one()
                keys[(name, p[0])] = None
    return grouped, keys


_NO_TOPIC = object()  # no topic's key (a name, an id's int, or None: the zero id)


class _Outcome:
    """One partition's answer before it becomes the response's PartitionData: an incremental
    fetch session leaves out those with nothing new (`fetch_sessions.CachedPartition`)."""

    __slots__ = ("partition", "error", "high_watermark", "last_stable_offset", "log_start_offset", "aborted",
                 "records", "diverging")

    def __init__(self, partition, error, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                 aborted=None, records=b"", diverging=None):
        self.partition = partition
        self.error = error
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted = aborted
        self.records = records
        self.diverging = diverging


async def _read_partitions(ctx, request, wanted_topics, response_type, steps: Steps, previous=None,
                           only: set | None = None):
    """Reads each partition: [(name, topic id, [(key, _Outcome)])], the bytes read, and whether
    any partition failed (which answers at once). With `previous` and `only` (a follower's fetch
    woken with nothing read yet), only the partitions notified meanwhile are read again and the
    others keep their answers: every append, HW move, role change and removal notifies, and a
    follower's fetch names hundreds of partitions and is woken by an append to any one of them
    and by each HW move the other follower makes; re-reading them all was O(partitions) per
    wake-up, several times per acks=all replication round. Read `steps.ENTRIES_PER_STEP` partitions
    at a time (`_read_recording` keeps the wake-ups of the turns given meanwhile)."""
    broker = ctx.broker
    aborted_type = nested(response_type, "AbortedTransaction")
    epoch_type = nested(response_type, "EpochEndOffset")
    replica_id = _replica_id(request)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED and replica_id < 0
    remaining = min(getattr(request, "max_bytes", _NO_LIMIT), broker.config["fetch.max.bytes"])
    total = 0
    failed = False
    by_id = ctx.api_version >= 13
    topics = []
    for t, (topic_name, topic_id, wanted_partitions) in enumerate(wanted_topics):
        topic_key = _id_key(topic_id) if by_id else topic_name  # as `_requested` keys it
        partitions = []
        for i, wanted in enumerate(wanted_partitions):
            await steps.one()
            index, fetch_offset, max_bytes, leader_epoch, last_fetched, _, _, _ = wanted  # `fetch_sessions.entry`
            if only is not None and (topic_name, index) not in only:
                partitions.append(previous[t][2][i])
                continue
            key = (topic_key, index)
            try:  # KIP-320: a fetcher with another leader epoch's metadata is told so
                if topic_name is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"unknown topic id {topic_id}")
                partition = leader_partition_at(broker, topic_name, index, leader_epoch, topic_id)
                if not partition.log.producer_state_ready:  # the LSO needs it: loaded in steps
                    await producer_state_ready(partition.log)
                    partition = leader_partition_at(broker, topic_name, index, leader_epoch, topic_id)
                log = partition.log
            except KafkaError as exc:
                partitions.append((key, _Outcome(index, exc.code)))
                failed = True
                continue
            high_watermark = log.high_watermark
            stable = log.last_stable_offset
            error, records, aborted, diverging = ErrorCode.none, b"", None, None
            try:
                if max_bytes < 0:
                    # Kafka's log read refuses a negative size (IllegalArgumentException).
                    raise KafkaError(ErrorCode.unknown_server_error, "negative partition_max_bytes")
                if (replica_id >= 0 and fetch_offset == log.log_end_offset
                        and last_fetched == log.leader_epoch_cache.latest_epoch):
                    # A follower at the log end in the latest epoch (most partitions of every
                    # replica fetch): nothing can diverge and nothing is there to read.
                    broker.replicas.follower_fetched(topic_name, index, replica_id, fetch_offset,
                                                     int(time.time() * 1000))
                    partitions.append((key, _Outcome(index, ErrorCode.none, log.high_watermark, stable,
                                                     log.log_start_offset)))
                    continue
                diverging = _diverging(last_fetched, fetch_offset, partition, epoch_type)
                if replica_id >= 0 and diverging is None and fetch_offset <= log.log_end_offset:
                    # Only a fetch that continues the leader's log tells the follower's progress.
                    broker.replicas.follower_fetched(topic_name, index, replica_id, fetch_offset,
                                                     int(time.time() * 1000))
                    high_watermark = log.high_watermark
                max_offset = log.log_end_offset if replica_id >= 0 else stable if read_committed else high_watermark
                if diverging is not None:  # the fetcher must truncate first: answer at once
                    failed = True
                elif log.log_start_offset <= fetch_offset == max_offset:
                    # Caught up: what the read would find (nothing), without the read. Most of an
                    # idle session's partitions are here each round.
                    aborted = () if read_committed else None
                else:
                    data = log.read(
                        fetch_offset,
                        min(max_bytes, max(remaining, 0)),
                        max_offset=max_offset,
                        min_one_batch=total == 0,
                        with_aborted=read_committed,
                        lazy=True,
                    )
                    records = data.records
                    if ctx.api_version < 4:  # converted as the socket takes it (records/legacy.py)
                        try:
                            records = await down_converted(records, 0 if ctx.api_version < 2 else 1, steps.turn)
                        except RecordsGone:  # the segment changed during the walk's turns:
                            records = b""  # nothing this time, the consumer fetches again
                    if read_committed:
                        aborted = tuple(make(aborted_type, producer_id=txn.producer_id, first_offset=txn.first_offset)
                                        for txn in data.aborted_transactions)
            except KafkaError as exc:
                error = exc.code
                failed = True
            remaining -= len(records)
            total += len(records)
            partitions.append((key, _Outcome(index, error, high_watermark, stable, log.log_start_offset,
                                             aborted, records, diverging)))
        topics.append((topic_name, topic_id, partitions))
    return topics, total, failed


async def _read_recording(ctx, request, grouped, keys: dict, response_type, steps: Steps, previous=None,
                          only: set | None = None):
    """`_read_partitions`, and which of `keys` were notified while it read: when it gave the
    loop turns (more than `steps.ENTRIES_PER_STEP` partitions), an append to a partition it had
    already read woke nothing, and the fetch must read again instead of waiting."""
    recorded = ctx.broker.replicas.delayed_fetches.recording()
    try:
        read, total, failed = await _read_partitions(ctx, request, grouped, response_type, steps, previous, only)
    finally:
        ctx.broker.replicas.delayed_fetches.stop_recording(recorded)
    return read, total, failed, {key for key in recorded if key in keys}


async def _key_set(keys: list, steps: Steps) -> set:
    """The partitions an incremental answer names, as a set built in steps: most of a session
    of 200,000 may have something new (or an error)."""
    found = set()
    for key in keys:
        await steps.one()
        found.add(key)
    return found


async def _response_topics(response_type, read, kept: set | None, hints: LeaderHints, steps: Steps) -> tuple:
    """The response's topics: the partitions `kept` (None: all) of those read, in the order read (a
    partition answered with an error carries empty records, never null: librdkafka refuses
    the whole response otherwise). A partition left out costs a set lookup, counted as a
    `_SKIPS_PER_STEP`th of a step: an incremental answer names one or two of a session's
    hundreds, and a turn of the loop per 256 of those delayed a follower's answer for nothing."""
    topic_type = nested(response_type, "FetchableTopicResponse")
    partition_type = nested(response_type, "PartitionData")
    topics = []
    skipped = 0
    for topic_name, topic_id, outcomes in read:
        partitions = []
        for key, o in outcomes:
            if kept is not None and key not in kept:
                skipped += 1
                if skipped % _SKIPS_PER_STEP == 0:
                    await steps.one()
                continue
            await steps.one()
            partitions.append(make(
                partition_type, partition_index=o.partition, error_code=o.error, high_watermark=o.high_watermark,
                last_stable_offset=o.last_stable_offset, log_start_offset=o.log_start_offset,
                aborted_transactions=o.aborted, preferred_read_replica=-1, records=o.records,
                **({} if o.diverging is None else {"diverging_epoch": o.diverging}),
                **hints.current_leader(topic_name, o.partition, o.error)))
        partitions = tuple(partitions)
        if partitions:
            topics.append(make(topic_type, topic=topic_name, topic_id=topic_id, partitions=partitions))
    return tuple(topics)


async def _encoded_if_empty(ctx, error, session_id, read, kept: set | None) -> EncodedBody | None:
    """The answer's body, encoded once and reused, when it carries no records and no partition
    error: a long poll that timed out, a follower's fetch with nothing new. Those say the same
    thing round after round (the same offsets), and building and encoding them each time was
    most of the CPU such an answer costs. None when anything was read or failed, or when it
    names more than `_EMPTY_ANSWER_MAX_PARTITIONS` partitions (`kept`, None: all read)."""
    if (sum(len(outcomes) for _, _, outcomes in read) if kept is None else len(kept)) > _EMPTY_ANSWER_MAX_PARTITIONS:
        return None
    key = [ctx.api_version, error, session_id]
    for topic_name, topic_id, outcomes in read:
        for partition_key, o in outcomes:
            if kept is None or partition_key in kept:
                if o.error or o.records or o.diverging is not None:
                    return None
                key.append((topic_name, topic_id, o.partition, o.high_watermark, o.last_stable_offset,
                            o.log_start_offset, o.aborted is None))
    key = tuple(key)
    body = _EMPTY_ANSWERS.get(key)
    if body is None:
        hints = LeaderHints(ctx.broker.metadata, ctx.response_type)  # names no leader: no partition failed
        body = EncodedBody(encode_item(make(
            ctx.response_type, throttle_time=timedelta(0), error_code=error, session_id=session_id,
            responses=await _response_topics(ctx.response_type, read, kept, hints, Steps()),
            node_endpoints=hints.node_endpoints())))
        size = len(body) + _KEY_BYTES_PER_PARTITION * (len(key) - 3)
        if _empty_answers_held[0] + size > _EMPTY_ANSWERS_BYTES:
            _EMPTY_ANSWERS.clear()
            _empty_answers_held[0] = 0
        if size <= _EMPTY_ANSWERS_BYTES:
            _EMPTY_ANSWERS[key] = body
            _empty_answers_held[0] += size
    return body


def _progress_first(ctx, request, wanted: dict) -> bool:
    """A follower's incremental fetch tells its progress on the partitions it names before
    anything else, in the step that took the request: the high watermark moves, and the
    acks=all produce waiting for it answers, at once. The read that follows walks the session
    (Kafka's incremental context reads every partition of it), and a partition that returned
    records is last in the session's order: when that walk read all 333 partitions a few
    hundred per turn of the loop, a loaded broker took 7-18 ms of turns before it reached the
    one partition that moved (docs/performance.md, "one acks=all round"). The same checks as the read's
    (`_read_partitions`): the partition led here at the request's leader epoch, no diverging
    epoch, the fetch offset within the log. A session that does not exist or expects another
    epoch is left to the read, which answers the session error without reading. Returns whether
    a HW moved: the handler then gives the loop a turn, so the produces it completed answer
    before its read (which, leaving out caught-up partitions, no longer yields on its own)."""
    session = ctx.broker.fetch_sessions.get(getattr(request, "session_id", INVALID_SESSION_ID))
    if session is None or session.epoch != getattr(request, "session_epoch", FINAL_EPOCH):
        return False
    broker = ctx.broker
    replica_id = _replica_id(request)
    moved = False
    for (topic_key, index), wanted_partition in wanted.items():
        if ctx.api_version >= 13:
            info = None if topic_key is None else broker.metadata.topic_by_id(uuid.UUID(int=topic_key))
            if info is None:
                continue
            topic_name, topic_id = info.name, uuid.UUID(int=topic_key)
        else:
            topic_name, topic_id = topic_key, None
        _, fetch_offset, _, leader_epoch, last_fetched, _, _, _ = entry(index, wanted_partition)
        try:
            partition = leader_partition_at(broker, topic_name, index, leader_epoch, topic_id)
            if (fetch_offset <= partition.log.log_end_offset
                    and (last_fetched < 0 or diverging_epoch(partition.log, partition.leader_epoch, last_fetched,
                                                              fetch_offset) is None)):
                high_watermark = partition.log.high_watermark
                broker.replicas.follower_fetched(topic_name, index, replica_id, fetch_offset,
                                                 int(time.time() * 1000))
                moved = moved or partition.log.high_watermark != high_watermark
        except KafkaError:
            continue  # the read answers it
    return moved


async def _leave_out_caught_up(broker, replica_id: int, partitions: list, named: dict, steps: Steps
                               ) -> tuple[list, set]:
    """A follower's incremental fetch: the session's partitions to read, and those left out
    (their keys). Left out are those the request does not name where the follower is at the log
    end in the latest epoch and was last told the current HW and log start: the read would find
    nothing and the session would not name them (`fetch_sessions._told`). The follower's
    progress on them is told all the same (`follower_fetched`, as the read does; a HW it moves
    makes the partition read). Kafka's incremental context reads every partition of the session;
    here that walk was 18 us of the loop per partition on a loaded machine, 6 ms for a session
    of 333, twice per replication round and per follower (docs/performance.md). A partition
    left out that is notified while the fetch waits is read then (`_bring_back`)."""
    hosted = broker.replicas.partitions
    now = int(time.time() * 1000)
    read, quiet = [], set()
    for pair in partitions:
        key, cached = pair
        if key not in named:
            partition = hosted.get(key)
            if partition is not None and _caught_up(broker, partition, replica_id, cached, now):
                quiet.add(key)
                if len(quiet) % _SKIPS_PER_STEP == 0:
                    await steps.one()
                continue
        read.append(pair)
    return read, quiet


def _caught_up(broker, partition, replica_id: int, cached: tuple, now: int) -> bool:
    """Whether this follower's read of `partition` would find nothing new for it (`cached`: its
    session entry, `fetch_sessions.CachedPartition`); tells the leader its progress if so."""
    index, fetch_offset, max_bytes, leader_epoch, last_fetched, _, told_hw, told_log_start = cached
    state = partition.leader_state
    if state is None or replica_id not in state.isr or max_bytes < 0:
        return False
    if leader_epoch >= 0 and leader_epoch != partition.leader_epoch:
        return False  # FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH: the read answers it
    log = partition.log
    if (fetch_offset != log.log_end_offset or told_log_start != log.log_start_offset
            or (last_fetched >= 0 and last_fetched != log.leader_epoch_cache.latest_epoch)):
        return False
    progress = state.followers.get(replica_id)
    if progress is not None and progress.log_end_offset == fetch_offset:
        # What `follower_fetched` does when the follower's offset did not move: the HW, which
        # only moves when an offset or the ISR does, stays; the follower is in the ISR already.
        progress.on_fetch(fetch_offset, log.log_end_offset, now)
    else:
        broker.replicas.follower_fetched(partition.topic, index, replica_id, fetch_offset, now)
    return told_hw == log.high_watermark


def _bring_back(grouped: list, quiet: set, notified: set, session) -> None:
    """Partitions `_leave_out_caught_up` left out and notified since: read them too (at the end
    of `grouped`, where a partial re-read finds no earlier answer for them and reads them)."""
    for key in notified & quiet:
        quiet.discard(key)
        cached = session.partitions.get(key)
        if cached is None:  # forgotten meanwhile
            continue
        if grouped and grouped[-1][0] == key[0]:
            grouped[-1][2].append(cached)
        else:
            grouped.append((key[0], None, [cached]))


async def handle(ctx, request):
    response_type = ctx.response_type
    broker = ctx.broker
    steps = Steps()  # 200,000 partitions in one Fetch held the loop 1.8 s of CPU
    wanted, forgotten = await _requested(ctx, request, steps)
    if _replica_id(request) >= 0 and getattr(request, "session_epoch", FINAL_EPOCH) > 0 and steps.yields == 0:
        if _progress_first(ctx, request, wanted):  # (an incremental request naming thousands: the read does it)
            await asyncio.sleep(0)  # the acks=all produces it completed answer before this fetch's read
    context, partitions = await new_context(
        broker.fetch_sessions, ctx.api_version, getattr(request, "session_id", INVALID_SESSION_ID),
        getattr(request, "session_epoch", FINAL_EPOCH), _replica_id(request) >= 0, wanted, forgotten, now_ms(), steps)
    await release_retired(broker.fetch_sessions, steps)  # the session a full fetch closed, one grown too big
    wait_s = request.max_wait.total_seconds()
    deadline = time.monotonic() + wait_s
    follower = _replica_id(request) >= 0
    quiet: set = set()
    leaves_out = follower and isinstance(context, IncrementalFetch) and ctx.api_version < 13  # Ottla's followers: v12
    # What is notified from the moment partitions are left out until the fetch watches them.
    recorded = broker.replicas.delayed_fetches.recording() if leaves_out else set()
    try:
        if leaves_out:
            partitions, quiet = await _leave_out_caught_up(broker, _replica_id(request), partitions, wanted, steps)
        grouped, keys = await _grouped(ctx, partitions, steps)  # nothing to read after a session error
        keys.update(dict.fromkeys(quiet))  # watched all the same
        if isinstance(partitions, list):  # an incremental fetch's copy of its session, in pairs
            await _let_go(steps, partitions)
        if not isinstance(context, FullFetch):  # which makes its session of `wanted`
            await _let_go(steps, wanted)
        partitions = wanted = forgotten = None
        read, total, failed, missed = await _read_recording(ctx, request, grouped, keys, response_type, steps)
    finally:
        if leaves_out:
            broker.replicas.delayed_fetches.stop_recording(recorded)
    missed |= recorded & quiet
    while total < request.min_bytes and keys and not failed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # A consumer's answers are not kept while waiting: a full garbage collection walks
        # every waiting fetch's objects. A follower's are, to re-read only what was notified.
        notified: set | None = set() if follower else None
        if not follower:
            read = None  # not in steps: a turn given before it watches could miss an append
        if missed:  # notified while it was being read, before it watched: woken already
            woken = True
            if notified is not None:
                notified |= missed
        else:
            woken = await broker.replicas.delayed_fetches.wait(keys, remaining, notified, _replica_id(request))
        if quiet and notified and not quiet.isdisjoint(notified):
            _bring_back(grouped, quiet, notified, context.session)
        if woken and notified and total == 0:
            read, total, failed, missed = await _read_recording(ctx, request, grouped, keys, response_type, steps,
                                                                read, notified)
        else:
            read, total, failed, missed = await _read_recording(ctx, request, grouped, keys, response_type, steps)
        if not woken:  # max_wait has passed: answered with whatever is there
            break
    outcomes = [pair for _, _, topic_outcomes in read for pair in topic_outcomes]
    error, session_id, kept = await context.finish(outcomes, now_ms(), steps)
    await release_retired(broker.fetch_sessions, steps)  # those evicted for a new one
    # None: all of them (a set of 200,000 keys took a step of 50-100 ms).
    kept = None if len(kept) == len(outcomes) else await _key_set(kept, steps)
    outcomes = None
    if total == 0 and not failed:
        encoded = await _encoded_if_empty(ctx, error, session_id, read, kept)
        if encoded is not None:
            await _let_go(steps, *(outcomes for _, _, outcomes in read), *(wanted for _, _, wanted in grouped), keys,
                          kept or ())
            return encoded
    hints = LeaderHints(broker.metadata, response_type)
    response = make(response_type, throttle_time=timedelta(0), error_code=error, session_id=session_id,
                    responses=await _response_topics(response_type, read, kept, hints, steps),
                    node_endpoints=hints.node_endpoints())
    await _let_go(steps, *(outcomes for _, _, outcomes in read), *(wanted for _, _, wanted in grouped), keys,
                  kept or ())
    return response


async def _let_go(steps: Steps, *held) -> None:
    """Empties each of `held` (lists, dicts, sets) a step at a time: what the answer was made
    from would otherwise all go at once when the handler returns (200,000 partitions' outcomes
    and keys: 40-80 ms of CPU in one step). Up to `_LET_GO_AT_ONCE` entries in all go with the
    handler (a hundred microseconds): a follower's session of 333 partitions gave the loop five
    turns here before its answer left, each a wait behind every other ready task."""
    if sum(len(container) for container in held) <= _LET_GO_AT_ONCE:
        return
    for container in held:
        while container:
            await steps.one()
            container.popitem() if isinstance(container, dict) else container.pop()
