"""Incremental fetch sessions (KIP-227): the broker's cache of what each fetcher asks for.

A fetcher (consumer or follower) that sends a full Fetch with session id 0 and epoch 0 gets a
session id back; its next requests name that id and the next epoch, carry only the partitions
that are new or whose fetch position changed, list the ones to drop in `forgotten_topics_data`,
and are answered only for the partitions with something new (records, a moved high watermark
or log start offset, an error, a diverging epoch). Partitions left out keep their cached fetch
position. Kafka's `FetchSession.scala` (`FetchSessionCache`, `FetchManager`, the fetch contexts)
is the model; one cache, not the shards of Kafka 3.8+ (KAFKA-9401), since one event loop
serves every request.

A session may hold hundreds of thousands of partitions, so the walks over all of them (making
a session, applying an incremental request, answering one) give the event loop a turn every
few hundred partitions through the caller's `steps` (`server/steps.py`; issue 11: creating a
session of 200,000 partitions held the loop for 160 ms of CPU, 0.5 s with the collections it
caused). Kafka takes each session's lock for those walks; here `FetchSession.lock` keeps a
second request on the session from getting in between two steps of one. A session the cache
lets go of (closed, evicted) is emptied in steps too (`release_retired`).

Pure: no sockets, no clock. Callers pass the time (`now_ms`) and the request's partitions as
objects with Kafka's field names (`fetch_offset`, `partition_max_bytes`,
`current_leader_epoch`, `last_fetched_epoch`, `log_start_offset`), keyed by (topic, partition)
where topic is the name (Fetch v7-v12) or the topic id (v13+, KIP-516; the handler passes its
int, which the cyclic collector does not track, where a `uuid.UUID` it does).

Eviction is Kafka's: the cache holds `max.incremental.fetch.session.cache.slots` sessions; when
it is full a new session may take the place of a session unused for `EVICTION_MS`, else of the
least valuable evictable one, ordered (privileged, size), by a session that outranks it:
followers' sessions are privileged, evictable only by a follower's with more partitions once
`EVICTION_MS` old; consumers' sessions are evictable by a follower's at once, and by a
consumer's with more partitions once `EVICTION_MS` old.

Memory is bounded by the configuration, not by what fetchers send: the sessions together hold
at most `PARTITIONS_PER_SLOT` partitions per slot (about 240 bytes each: 240 MB at the default
1,000 slots). Kafka has no such bound (one request naming millions of partitions would be kept
until evicted). A full fetch that would go beyond it gets no session (the fetcher keeps sending
full requests, as when the slots are taken); an incremental one that would grow its session
beyond it closes the session with FETCH_SESSION_ID_NOT_FOUND, so the fetcher starts over with
a full request.
"""

from __future__ import annotations

import asyncio
import random
from bisect import bisect_left, insort
from typing import Any, Hashable, Iterable, NamedTuple

from .errors import ErrorCode

__all__ = ["FetchSessionCache", "FetchSession", "CachedPartition", "FetchSessionHandler", "new_context", "next_epoch",
           "entry",
           "release_retired",
           "PARTITIONS_PER_SLOT",
           "SESSIONLESS",
           "INVALID_SESSION_ID", "INITIAL_EPOCH", "FINAL_EPOCH", "EVICTION_MS"]

INVALID_SESSION_ID = 0  # no session: the legacy fetch, or "none created"
INITIAL_EPOCH = 0  # full fetch, create a session if possible
FINAL_EPOCH = -1  # full fetch, no session
MAX_EPOCH = 2**31 - 1
# Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS (a constant, not a config): a session unused
# this long is stale, and a session must be this old before a rival of its kind may evict it.
EVICTION_MS = 120_000
PARTITIONS_PER_SLOT = 1_000
FIRST_VERSION = 7  # Fetch v7 introduced sessions
TOPIC_ID_VERSION = 13  # Fetch v13 names topics by id

Key = tuple[Hashable, int]  # (topic name or topic id, partition)
# Pairs of a session copied per step of the caller's `steps` (`_incremental`): a pair costs
# a tenth of a microsecond, and a turn of the loop per 256 of them delayed every incremental
# fetch of a few hundred partitions behind every other ready task.
_COPIES_PER_STEP = 16


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`; wraps to 1, never to the full-fetch epochs 0 and -1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


class CachedPartition(NamedTuple):
    """One partition of a session: the request's last parameters, which an incremental request
    that leaves the partition out reuses, and what the last response told the fetcher (high
    watermark, log start offset), which decides whether the next response must name it.

    A session keeps them as plain tuples of ints (`entry`), which the cyclic collector stops
    tracking after their first collection: as objects, a live session of 200,000 partitions
    added 200,000 objects to every full collection's walk (issue 11, docs/performance.md). An
    incremental request reads those tuples themselves, not views of them: a tuple subclass is
    never untracked, and a waiting fetch would hold one per partition for its long poll. This
    class names the fields."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int
    log_start_offset: int  # the fetcher's (a follower's)
    high_watermark: int  # -1: unknown, the first response always names the partition
    leader_log_start_offset: int


_HIGH_WATERMARK = CachedPartition._fields.index("high_watermark")
_LEADER_LOG_START = CachedPartition._fields.index("leader_log_start_offset")


def entry(partition: int, request: Any, high_watermark: int = -1, leader_log_start_offset: int = -1) -> tuple:
    """A session's entry for `partition` (the fields of `CachedPartition`) from a request's
    parameters; also the shape the Fetch handler reads every partition in."""
    return (partition, request.fetch_offset, request.partition_max_bytes,
            getattr(request, "current_leader_epoch", -1),  # v9+
            getattr(request, "last_fetched_epoch", -1),  # v12+
            getattr(request, "log_start_offset", -1), high_watermark, leader_log_start_offset)


def _told(cached: tuple, outcome: Any) -> tuple[bool, tuple]:
    """Whether an incremental response must carry this partition's `outcome` (attributes
    `error`, `high_watermark`, `log_start_offset`, `records`, `diverging`), and the entry
    remembering what the fetcher is told (`cached` itself if that did not change). An error
    also forgets the high watermark, so the partition is named again once the error clears."""
    respond = len(outcome.records) > 0 or outcome.diverging is not None
    high_watermark, leader_log_start = cached[_HIGH_WATERMARK], cached[_LEADER_LOG_START]
    if outcome.high_watermark != high_watermark:
        respond = True
        high_watermark = outcome.high_watermark
    if outcome.log_start_offset != leader_log_start:
        respond = True
        leader_log_start = outcome.log_start_offset
    if outcome.error != ErrorCode.none:
        respond = True
        high_watermark = -1
    if high_watermark != cached[_HIGH_WATERMARK] or leader_log_start != cached[_LEADER_LOG_START]:
        cached = cached[:_HIGH_WATERMARK] + (high_watermark, leader_log_start)
    return respond, cached


class FetchSession:
    """One fetcher's session: its partitions in fetch order (a dict keeps insertion order;
    a partition that returned records moves to the end, so the others get the response's
    byte budget first next time), the epoch its next request must carry, and the times and
    size the cache orders sessions by. `lock` is held while a request updates or answers it
    (Kafka's `session.synchronized`): those walks take several turns of the loop."""

    __slots__ = ("id", "privileged", "uses_topic_ids", "creation_ms", "last_used_ms", "epoch", "partitions",
                 "cached_size", "lock", "users")

    def __init__(self, session_id: int, privileged: bool, uses_topic_ids: bool, partitions: dict[Key, tuple],
                 now_ms: int):
        self.id = session_id
        self.privileged = privileged
        self.uses_topic_ids = uses_topic_ids
        self.creation_ms = self.last_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.partitions = partitions
        self.cached_size = -1  # the size the cache last accounted for; -1: not in the cache
        self.lock = asyncio.Lock()
        self.users = 0  # requests between their context and its answer (`IncrementalFetch`)

    async def update(self, fetch_data: dict[Key, Any], forgotten: Iterable[Key], steps) -> tuple[int, int, int]:
        """Apply an incremental request: add or update the partitions it names, then drop the
        forgotten ones, in `steps`. Returns how many were (added, updated, removed)."""
        added = updated = removed = 0
        for key, request in fetch_data.items():
            await steps.one()
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = entry(key[1], request)
                added += 1
            else:
                self.partitions[key] = entry(key[1], request, cached[_HIGH_WATERMARK], cached[_LEADER_LOG_START])
                updated += 1
        for key in forgotten:
            await steps.one()
            if self.partitions.pop(key, None) is not None:
                removed += 1
        return added, updated, removed


class FetchSessionCache:
    """At most `max_entries` sessions by id, with the orderings eviction needs kept sorted:
    (last used, id) for staleness and (privileged, size, id) for value."""

    def __init__(self, max_entries: int, eviction_ms: int = EVICTION_MS, rng: random.Random | None = None,
                 max_partitions: int | None = None):
        self.max_entries = max_entries
        self.max_partitions = max_entries * PARTITIONS_PER_SLOT if max_partitions is None else max_partitions
        self.eviction_ms = eviction_ms
        self._random = rng or random.Random()
        self._sessions: dict[int, FetchSession] = {}
        self._last_used: list[tuple[int, int]] = []
        self._evictable_by_all: list[tuple[bool, int, int]] = []
        self._evictable_by_privileged: list[tuple[bool, int, int]] = []
        self.total_partitions = 0
        self.evictions = 0
        self.retired: list[FetchSession] = []  # removed, to be emptied in steps (`release_retired`)

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def _new_id(self) -> int:
        while True:
            session_id = self._random.randint(1, MAX_EPOCH - 1)
            if session_id not in self._sessions:
                return session_id

    def maybe_create(self, now_ms: int, privileged: bool, uses_topic_ids: bool,
                     partitions: dict[Key, tuple]) -> int:
        """A new session for these partitions if there is room or something may be evicted
        for it; its id, else INVALID_SESSION_ID (the fetcher keeps sending full requests)."""
        size = len(partitions)
        if size > self.max_partitions:
            return INVALID_SESSION_ID
        if len(self._sessions) >= self.max_entries and not self._try_evict(privileged, size, now_ms):
            return INVALID_SESSION_ID
        while self.total_partitions + size > self.max_partitions:
            if not self._try_evict(privileged, size, now_ms):
                return INVALID_SESSION_ID
        session = FetchSession(self._new_id(), privileged, uses_topic_ids, partitions, now_ms)
        self._sessions[session.id] = session
        self.touch(session, now_ms)
        return session.id

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        if not self._last_used:
            return False
        last_used_ms, oldest = self._last_used[0]
        if now_ms - last_used_ms > self.eviction_ms:
            victim = self._sessions[oldest]
        else:
            candidates = self._evictable_by_privileged if privileged else self._evictable_by_all
            if not candidates or (privileged, size, 0) < candidates[0]:
                return False
            victim = self._sessions[candidates[0][2]]
        self.remove(victim)
        self.evictions += 1
        return True

    def remove(self, session: FetchSession | int) -> FetchSession | None:
        if isinstance(session, int):
            session = self._sessions.get(session)
            if session is None:
                return None
        if self._sessions.pop(session.id, None) is None:
            return None
        _discard(self._last_used, (session.last_used_ms, session.id))
        if session.cached_size >= 0:
            key = (session.privileged, session.cached_size, session.id)
            _discard(self._evictable_by_all, key)
            _discard(self._evictable_by_privileged, key)
            self.total_partitions -= session.cached_size
        session.cached_size = -1
        self.retired.append(session)
        return session

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """The session was used at `now_ms`: re-file it under its new time and size."""
        _discard(self._last_used, (session.last_used_ms, session.id))
        session.last_used_ms = now_ms
        insort(self._last_used, (now_ms, session.id))
        if session.cached_size >= 0:
            old = (session.privileged, session.cached_size, session.id)
            _discard(self._evictable_by_all, old)
            _discard(self._evictable_by_privileged, old)
            self.total_partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        key = (session.privileged, session.cached_size, session.id)
        old_enough = now_ms - session.creation_ms > self.eviction_ms
        if not session.privileged or old_enough:
            insort(self._evictable_by_privileged, key)
        if old_enough:
            insort(self._evictable_by_all, key)
        self.total_partitions += session.cached_size


def _discard(ordered: list, item) -> None:
    at = bisect_left(ordered, item)
    if at < len(ordered) and ordered[at] == item:
        del ordered[at]


# The fetch contexts (Kafka's FetchContext subclasses): how one request's response is trimmed
# and numbered. `new_context` returns one with the partitions to read, [(key, request
# parameters)] in order (an incremental fetch's are the session's `entry` tuples); `await finish(outcomes, now_ms, steps)` takes [(key, outcome)] in that
# order and returns (top-level error, response session id, the keys the response names). Contexts that
# need no state are shared, so a waiting fetch holds no object for them (a full garbage
# collection walks every waiting fetch's objects).

class SessionError:
    """A request on a session that is gone or out of step: answered with the error alone."""

    __slots__ = ("error",)

    def __init__(self, error: ErrorCode):
        self.error = error

    async def finish(self, outcomes, now_ms: int, steps) -> tuple[ErrorCode, int, list[Key]]:
        return self.error, INVALID_SESSION_ID, []


_SESSION_ERRORS = {error: SessionError(error) for error in (ErrorCode.fetch_session_id_not_found,
                                                           ErrorCode.invalid_fetch_session_epoch,
                                                           ErrorCode.fetch_session_topic_id_error)}


class Sessionless:
    """A full fetch that neither uses nor creates a session (epoch -1, Fetch v0-v6, or an
    incremental request that forgot the session's last partition); one instance serves all."""

    __slots__ = ()

    async def finish(self, outcomes, now_ms: int, steps) -> tuple[ErrorCode, int, list[Key]]:
        return ErrorCode.none, INVALID_SESSION_ID, [key for key, _ in outcomes]


SESSIONLESS = Sessionless()


class FullFetch:
    """A full fetch with epoch 0: answered in full, and a session is created from what the
    response tells the fetcher, if the cache has or can make room."""

    __slots__ = ("_requests", "_cache", "_uses_topic_ids", "_privileged")

    def __init__(self, cache: FetchSessionCache, fetch_data: dict[Key, Any], uses_topic_ids: bool, privileged: bool):
        self._requests = fetch_data  # the session is made of them
        self._cache = cache
        self._uses_topic_ids = uses_topic_ids
        self._privileged = privileged

    async def finish(self, outcomes, now_ms: int, steps) -> tuple[ErrorCode, int, list[Key]]:
        cache = self._cache
        session_id = INVALID_SESSION_ID
        if cache.max_entries > 0 and len(outcomes) <= cache.max_partitions:  # else it could never be made
            cached = {}
            for key, outcome in outcomes:
                await steps.one()
                # Popped: the request's keys go a step at a time, not all when the context goes.
                cached[key] = entry(key[1], self._requests.pop(key), outcome.high_watermark, outcome.log_start_offset)
            session_id = cache.maybe_create(now_ms, self._privileged, self._uses_topic_ids, cached)
        return ErrorCode.none, session_id, [key for key, _ in outcomes]


class IncrementalFetch:
    """An incremental fetch on a live session: reads every partition of the session, answers
    only those with something new."""

    __slots__ = ("session", "_expected_epoch")

    def __init__(self, session: FetchSession, request_epoch: int):
        self.session = session
        self._expected_epoch = next_epoch(request_epoch)
        session.users += 1

    async def finish(self, outcomes, now_ms: int, steps) -> tuple[ErrorCode, int, list[Key]]:
        session = self.session
        try:
            async with session.lock:
                return await self._answer(session, outcomes, steps)
        finally:
            session.users -= 1

    async def _answer(self, session: FetchSession, outcomes, steps) -> tuple[ErrorCode, int, list[Key]]:
        if session.epoch != self._expected_epoch:  # another request on the session got in meanwhile
            return ErrorCode.invalid_fetch_session_epoch, session.id, []
        kept = []
        partitions = session.partitions
        for key, outcome in outcomes:
            await steps.one()
            cached = partitions.get(key)
            if cached is None:  # forgotten by a request that got in meanwhile
                continue
            respond, told = _told(cached, outcome)
            if told is not cached:
                partitions[key] = told
            if respond:
                kept.append(key)
                if len(outcome.records) > 0:
                    partitions[key] = partitions.pop(key)
        return ErrorCode.none, session.id, kept


async def new_context(cache: FetchSessionCache, version: int, session_id: int, epoch: int, privileged: bool,
                      fetch_data: dict[Key, Any], forgotten: Iterable[Key], now_ms: int, steps):
    """Kafka's FetchManager.newContext: what a Fetch with this session id and epoch means, as
    (context, the partitions to read)."""
    if version < FIRST_VERSION:
        return SESSIONLESS, fetch_data.items()
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        if session_id != INVALID_SESSION_ID:
            cache.remove(session_id)  # a full request closes the session it names
        if epoch == FINAL_EPOCH:
            return SESSIONLESS, fetch_data.items()
        return FullFetch(cache, fetch_data, version >= TOPIC_ID_VERSION, privileged), fetch_data.items()
    session = cache.get(session_id)
    if session is None:
        return _SESSION_ERRORS[ErrorCode.fetch_session_id_not_found], ()
    async with session.lock:
        return await _incremental(cache, session, version, epoch, fetch_data, forgotten, now_ms, steps)


async def _incremental(cache: FetchSessionCache, session: FetchSession, version: int, epoch: int,
                       fetch_data: dict[Key, Any], forgotten: Iterable[Key], now_ms: int, steps):
    """An incremental request on `session`, whose lock it holds: checked, applied, numbered."""
    if cache.get(session.id) is not session:  # closed or evicted while this waited for the lock
        return _SESSION_ERRORS[ErrorCode.fetch_session_id_not_found], ()
    if session.epoch != epoch:
        return _SESSION_ERRORS[ErrorCode.invalid_fetch_session_epoch], ()
    if session.uses_topic_ids != (version >= TOPIC_ID_VERSION):
        return _SESSION_ERRORS[ErrorCode.fetch_session_topic_id_error], ()
    await session.update(fetch_data, forgotten, steps)
    if cache.get(session.id) is not session:  # closed or evicted between two steps of the update
        return _SESSION_ERRORS[ErrorCode.fetch_session_id_not_found], ()
    if cache.total_partitions - max(session.cached_size, 0) + len(session.partitions) > cache.max_partitions:
        cache.remove(session)  # grown past the cache's partition budget
        return _SESSION_ERRORS[ErrorCode.fetch_session_id_not_found], ()
    if not session.partitions:
        cache.remove(session)
        return SESSIONLESS, fetch_data.items()
    cache.touch(session, now_ms)
    session.epoch = next_epoch(session.epoch)
    partitions = []  # what to read: the session as it is now (a pair each, so made in steps)
    for key, cached in session.partitions.items():
        if len(partitions) % _COPIES_PER_STEP == 0:
            await steps.one()
        partitions.append((key, cached))
    return IncrementalFetch(session, epoch), partitions


async def release_retired(cache: FetchSessionCache, steps) -> None:
    """Empties the sessions the cache let go of (closed, evicted, grown past the budget) a
    step at a time: freed at once, one of 200,000 partitions held the loop 15-25 ms, and one
    session may hold the whole budget (`PARTITIONS_PER_SLOT` a slot). A session a request is
    still answering from goes with that request instead; one a request is still walking (its
    lock held: copying the partitions to read) is emptied after."""
    while cache.retired:
        session = cache.retired.pop()
        async with session.lock:
            if session.users:
                continue
            partitions = session.partitions
            while partitions:
                await steps.one()
                partitions.popitem()


class FetchSessionHandler:
    """The fetcher's side of a session with one broker (Kafka's FetchSessionHandler), for
    Ottla's followers: which partitions the next Fetch must name, and what its session id and
    epoch are. Partitions are keyed as on the broker, with their request parameters as a
    comparable value; only those added or changed since the last request are sent."""

    def __init__(self):
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._partitions: dict[Key, Hashable] = {}  # what the broker's session holds

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    def build(self, wanted: dict[Key, Hashable]) -> tuple[list[Key], list[Key]]:
        """(partitions to send, partitions to forget) for a fetch of `wanted`: all of them in a
        full fetch; else those new or whose parameters changed, and those no longer wanted."""
        previous, self._partitions = self._partitions, dict(wanted)
        if self.full:
            return list(wanted), []
        send = [key for key, params in wanted.items() if previous.get(key, _ABSENT) != params]
        return send, [key for key in previous if key not in wanted]

    def handle_response(self, error: ErrorCode, session_id: int, answered: Iterable[Key]) -> bool:
        """Take the response's session id and check what it names; False if the response must
        be ignored (a session error, or partitions it had no business naming), after which the
        next fetch is a full one."""
        if error != ErrorCode.none:
            if error == ErrorCode.fetch_session_id_not_found:
                self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH  # a full fetch, closing the session it names
            return False
        answered = set(answered)
        if not answered <= self._partitions.keys() or (self.full and len(answered) != len(self._partitions)):
            if self.full:
                self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH
            return False
        if session_id == INVALID_SESSION_ID:
            self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH
        elif self.full:
            self.session_id, self.epoch = session_id, next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def handle_error(self) -> None:
        """The request failed (timeout, lost connection): the next fetch is a full one."""
        self.epoch = INITIAL_EPOCH


_ABSENT = object()
