"""The fetch session cache (KIP-227) driven with explicit time: contexts, trimming, eviction."""

import asyncio
import gc
import random
from types import SimpleNamespace

import pytest

from ottla.errors import ErrorCode
from ottla.fetch_sessions import (EVICTION_MS, FINAL_EPOCH, INITIAL_EPOCH, INVALID_SESSION_ID, MAX_EPOCH,
                                  PARTITIONS_PER_SLOT,
                                  SESSIONLESS, CachedPartition, FetchSessionCache, FetchSessionHandler, FullFetch,
                                  IncrementalFetch, SessionError, next_epoch, release_retired)
from ottla.fetch_sessions import new_context as _new_context
from ottla.server.steps import ENTRIES_PER_STEP, Steps

V12, V13 = 12, 13


def wanted(offset, max_bytes=1 << 20):
    return SimpleNamespace(fetch_offset=offset, partition_max_bytes=max_bytes, current_leader_epoch=-1,
                           last_fetched_epoch=-1, log_start_offset=-1)


def position(params):
    """The fetch offset a partition is read from: the request's parameters (a full fetch), or
    the session's own entry (an incremental one, a plain tuple)."""
    return CachedPartition._make(params).fetch_offset if isinstance(params, tuple) else params.fetch_offset


def outcome(hw, records=b"", error=ErrorCode.none, log_start=0, diverging=None):
    return SimpleNamespace(high_watermark=hw, records=records, error=error, log_start_offset=log_start,
                           diverging=diverging)


def new_context(*args):
    """`fetch_sessions.new_context` as the Fetch handler calls it, with steps of its own."""
    return _new_context(*args, Steps())


class Opened:
    """What `new_context` returns, with its partitions kept for the test to look at."""

    def __init__(self, opening):
        self.context, partitions = asyncio.run(opening)
        self.parts = list(partitions)

    def partitions(self):
        return self.parts

    def finish(self, outcomes, now_ms):
        return asyncio.run(self.context.finish(outcomes, now_ms, Steps()))

    @property
    def error(self):
        return self.context.error


def read(context, answers):
    """What the handler does: read what the context says, hand back outcomes in that order."""
    keys = [key for key, _ in context.partitions()]
    return [(key, answers.get(key, outcome(10))) for key in keys]


def open_session(cache, partitions, *, version=V12, privileged=False, now=0, answers=None):
    context = Opened(new_context(cache, version, INVALID_SESSION_ID, INITIAL_EPOCH, privileged,
                                 {key: wanted(offset) for key, offset in partitions.items()}, [], now))
    assert isinstance(context.context, FullFetch)
    error, session_id, kept = context.finish(read(context, answers or {}), now)
    assert error == ErrorCode.none and kept == list(partitions)
    return session_id


def incremental(cache, session_id, epoch, fetch=None, forget=(), *, version=V12, now=0, privileged=False):
    return Opened(new_context(cache, version, session_id, epoch, privileged,
                              {key: wanted(offset) for key, offset in (fetch or {}).items()}, list(forget), now))


def test_a_full_fetch_with_epoch_0_creates_a_session_and_epoch_minus_1_does_not():
    cache = FetchSessionCache(10, rng=random.Random(1))
    session_id = open_session(cache, {("t", 0): 0, ("t", 1): 0})
    assert session_id != INVALID_SESSION_ID and len(cache) == 1 and cache.total_partitions == 2
    assert cache.get(session_id).epoch == 1
    context = Opened(new_context(cache, V12, INVALID_SESSION_ID, FINAL_EPOCH, False, {("t", 0): wanted(0)}, [], 0))
    assert context.context is SESSIONLESS
    assert context.finish(read(context, {}), 0) == (ErrorCode.none, INVALID_SESSION_ID, [("t", 0)])
    assert len(cache) == 1


def test_before_v7_there_are_no_sessions():
    cache = FetchSessionCache(10)
    context = Opened(new_context(cache, 6, 0, 0, False, {("t", 0): wanted(0)}, [], 0))
    assert context.context is SESSIONLESS
    assert context.finish(read(context, {}), 0)[1] == INVALID_SESSION_ID and len(cache) == 0


@pytest.mark.parametrize("epoch", [INITIAL_EPOCH, FINAL_EPOCH])
def test_a_full_fetch_naming_a_session_closes_it(epoch):
    cache = FetchSessionCache(10)
    session_id = open_session(cache, {("t", 0): 0})
    context = Opened(new_context(cache, V12, session_id, epoch, False, {("t", 0): wanted(5)}, [], 0))
    assert cache.get(session_id) is None
    _, new_id, _ = context.finish(read(context, {}), 0)
    assert (new_id != INVALID_SESSION_ID) == (epoch == INITIAL_EPOCH) and new_id != session_id


def test_session_errors():
    cache = FetchSessionCache(10)
    by_name = open_session(cache, {("t", 0): 0})
    by_id = open_session(cache, {("id-t", 0): 0}, version=V13)
    assert incremental(cache, 424242, 1).error == ErrorCode.fetch_session_id_not_found
    assert incremental(cache, INVALID_SESSION_ID, 1).error == ErrorCode.fetch_session_id_not_found
    assert incremental(cache, by_name, 2).error == ErrorCode.invalid_fetch_session_epoch
    assert incremental(cache, by_name, 1, version=V13).error == ErrorCode.fetch_session_topic_id_error
    assert incremental(cache, by_id, 1, version=V12).error == ErrorCode.fetch_session_topic_id_error
    error = incremental(cache, by_name, 2)
    assert isinstance(error.context, SessionError) and list(error.partitions()) == []
    assert error.finish([], 0) == (ErrorCode.invalid_fetch_session_epoch, INVALID_SESSION_ID, [])
    # An error changes nothing: the right epoch still works.
    assert isinstance(incremental(cache, by_name, 1).context, IncrementalFetch)
    assert isinstance(incremental(cache, by_id, 1, version=V13).context, IncrementalFetch)


def test_incremental_requests_add_update_forget_and_keep_the_positions_left_out():
    cache = FetchSessionCache(10)
    session_id = open_session(cache, {("a", 0): 3, ("a", 1): 7, ("b", 0): 11})
    context = incremental(cache, session_id, 1, {("a", 1): 9, ("c", 0): 0}, forget=[("b", 0), ("zz", 9)])
    positions = {key: position(params) for key, params in context.partitions()}
    assert positions == {("a", 0): 3, ("a", 1): 9, ("c", 0): 0}
    assert cache.get(session_id).epoch == 2 and cache.total_partitions == 3
    context.finish(read(context, {}), 0)
    # Next round names nothing: the cached positions are read again.
    context = incremental(cache, session_id, 2)
    assert {key: position(params) for key, params in context.partitions()} == positions


def test_forgetting_every_partition_closes_the_session():
    cache = FetchSessionCache(10)
    session_id = open_session(cache, {("a", 0): 0})
    context = incremental(cache, session_id, 1, forget=[("a", 0)])
    assert context.context is SESSIONLESS and list(context.partitions()) == []
    assert context.finish([], 0) == (ErrorCode.none, INVALID_SESSION_ID, [])
    assert cache.get(session_id) is None and len(cache) == 0 and cache.total_partitions == 0


def test_an_incremental_response_names_only_partitions_with_something_new():
    cache = FetchSessionCache(10)
    keys = [("t", p) for p in range(6)]
    session_id = open_session(cache, dict.fromkeys(keys, 0), answers=dict.fromkeys(keys, outcome(10)))
    context = incremental(cache, session_id, 1)
    answers = {("t", 1): outcome(10, records=b"x" * 5),  # records
               ("t", 2): outcome(11),  # the high watermark moved
               ("t", 3): outcome(10, log_start=4),  # the log start moved
               ("t", 4): outcome(-1, error=ErrorCode.not_leader_or_follower),
               ("t", 5): outcome(10, diverging=SimpleNamespace(epoch=1, end_offset=3))}
    assert context.finish(read(context, answers), 0) == (ErrorCode.none, session_id, keys[1:])
    # A partition that returned records moves to the end of the session's read order.
    context = incremental(cache, session_id, 2)
    assert [key for key, _ in context.partitions()] == [keys[0], *keys[2:], keys[1]]
    # Nothing new anywhere: only the partition whose error just cleared (its HW was forgotten)
    # and the one that still diverges are named.
    answers = {("t", 3): outcome(10, log_start=4), ("t", 2): outcome(11),
               ("t", 5): outcome(10, diverging=SimpleNamespace(epoch=1, end_offset=3))}
    assert context.finish(read(context, answers), 0) == (ErrorCode.none, session_id, [("t", 4), ("t", 5)])
    context = incremental(cache, session_id, 3)
    assert context.finish(read(context, answers), 0) == (ErrorCode.none, session_id, [("t", 5)])


def test_a_full_fetch_answers_every_partition_and_caches_what_it_said():
    cache = FetchSessionCache(10)
    session_id = open_session(cache, {("t", 0): 0, ("t", 1): 0}, answers={("t", 0): outcome(5), ("t", 1): outcome(9)})
    context = incremental(cache, session_id, 1)
    answers = {("t", 0): outcome(5), ("t", 1): outcome(9)}
    assert context.finish(read(context, answers), 0)[2] == []


def test_a_live_session_adds_no_objects_to_the_collectors_walks():
    """issue 11: a session's cached partitions were objects the cyclic collector tracks, one
    each, so every full collection walked all of them (a live session of 200,000 made each
    one some 20 ms longer, docs/performance.md). Kept as tuples of ints, the collector stops
    tracking them at their first collection: a session of 20,000 leaves the count of tracked
    objects where it was, also after an incremental fetch moved positions and watermarks."""
    partitions = 20_000
    cache = FetchSessionCache(1, max_partitions=partitions)
    keys = [("t", p) for p in range(partitions)]
    gc.collect()
    tracked = len(gc.get_objects())
    session_id = open_session(cache, dict.fromkeys(keys, 0))
    context = incremental(cache, session_id, 1, dict.fromkeys(keys[::2], 5))
    assert context.finish(read(context, dict.fromkeys(keys[::3], outcome(11))), 0)[0] == ErrorCode.none
    del context
    gc.collect()
    cached = cache.get(session_id).partitions
    assert [key for key, entry in cached.items() if gc.is_tracked(entry)] == []
    assert len(gc.get_objects()) - tracked < 100  # the session, its lock: not one per partition
    positions = {key: position(params) for key, params in incremental(cache, session_id, 2).partitions()}
    assert positions == {key: 5 if key[1] % 2 == 0 else 0 for key in keys}


def test_two_requests_racing_on_one_session():
    """The second request got in before the first was answered: the first is refused."""
    cache = FetchSessionCache(10)
    session_id = open_session(cache, {("t", 0): 0})
    first = incremental(cache, session_id, 1)
    second = incremental(cache, session_id, 2)
    assert first.finish(read(first, {}), 0) == (ErrorCode.invalid_fetch_session_epoch, session_id, [])
    assert second.finish(read(second, {}), 0)[0] == ErrorCode.none


async def _session_of(cache, size: int) -> int:
    """A new session of partitions 0..size-1 of `t`, all answered at offset 10: its id."""
    context, parts = await _new_context(cache, V12, INVALID_SESSION_ID, INITIAL_EPOCH, False,
                                        {("t", p): wanted(0) for p in range(size)}, [], 0, Steps())
    _, session_id, _ = await context.finish([(key, outcome(10)) for key, _ in parts], 0, Steps())
    return session_id


def test_a_request_on_a_session_waits_while_another_walks_it():
    """Kafka's session lock: the answer to one request is worked out in steps, and a request on
    the session that arrives meanwhile (with the epoch that answer will tell) waits for it
    instead of changing the session under it, then goes ahead."""
    size = 2 * ENTRIES_PER_STEP

    async def scenario():
        cache = FetchSessionCache(10)
        session_id = await _session_of(cache, size)
        first, parts = await _new_context(cache, V12, session_id, 1, False, {}, [], 0, Steps())
        answering = asyncio.ensure_future(first.finish([(key, outcome(11)) for key, _ in parts], 0, Steps()))
        await asyncio.sleep(0)  # its walk has begun
        second = asyncio.ensure_future(_new_context(cache, V12, session_id, 2, False, {("u", 0): wanted(0)}, [], 0,
                                                    Steps()))
        await asyncio.sleep(0)
        waited = not second.done() and ("u", 0) not in cache.get(session_id).partitions
        return waited, await answering, (await second)[0], cache.get(session_id)

    waited, (error, _, kept), second, session = asyncio.run(scenario())
    assert waited
    assert error == ErrorCode.none and kept == [("t", p) for p in range(size)]
    assert isinstance(second, IncrementalFetch) and session.epoch == 3 and ("u", 0) in session.partitions


def test_a_session_closed_while_a_request_copies_it_is_emptied_after():
    """A full fetch closes the session while an incremental request on it is copying its
    partitions in steps: the session is emptied (`release_retired`) only once that request
    has its copy, and that request reads every partition, as Kafka's would."""
    size = 2 * ENTRIES_PER_STEP

    async def scenario():
        cache = FetchSessionCache(10)
        session_id = await _session_of(cache, size)
        copying = asyncio.ensure_future(_new_context(cache, V12, session_id, 1, False, {}, [], 0, Steps()))
        await asyncio.sleep(0)  # its copy has begun
        closing, _ = await _new_context(cache, V12, session_id, FINAL_EPOCH, False, {("t", 0): wanted(0)}, [], 0,
                                        Steps())
        await release_retired(cache, Steps())
        return closing, await copying, cache

    closing, (incremental, parts), cache = asyncio.run(scenario())
    assert closing is SESSIONLESS and len(cache) == 0
    assert isinstance(incremental, IncrementalFetch) and [key for key, _ in parts] == [("t", p) for p in range(size)]


def test_epochs_wrap_to_1():
    assert next_epoch(0) == 1 and next_epoch(MAX_EPOCH) == 1 and next_epoch(-1) == FINAL_EPOCH


def test_no_slots_means_no_sessions():
    cache = FetchSessionCache(0)
    context = Opened(new_context(cache, V12, 0, 0, True, {("t", 0): wanted(0)}, [], 0))
    assert context.finish(read(context, {}), 0)[1] == INVALID_SESSION_ID and len(cache) == 0


def _session(cache, size, *, privileged=False, now=0):
    return open_session(cache, {("t", p): 0 for p in range(size)}, privileged=privileged, now=now)


def test_the_sessions_together_hold_at_most_their_partition_budget():
    # Memory bounded by configuration, not by what fetchers name: no session for more
    # partitions than the budget, room made only by what may be evicted, and a session an
    # incremental request grows past the budget is closed (the fetcher starts over in full).
    cache = FetchSessionCache(10, max_partitions=10)
    assert _session(cache, 11) == INVALID_SESSION_ID and len(cache) == 0
    consumer = _session(cache, 6)
    assert _session(cache, 5, now=10) == INVALID_SESSION_ID  # 11 > 10 and nothing evictable yet
    follower = _session(cache, 5, privileged=True, now=20)  # a follower evicts a consumer at once
    assert follower != INVALID_SESSION_ID and cache.get(consumer) is None and cache.total_partitions == 5
    grown = incremental(cache, follower, 1, {("u", p): 0 for p in range(6)}, privileged=True, now=30)
    assert grown.error == ErrorCode.fetch_session_id_not_found
    assert cache.get(follower) is None and len(cache) == 0 and cache.total_partitions == 0
    assert FetchSessionCache(3).max_partitions == 3 * PARTITIONS_PER_SLOT


def test_a_full_cache_keeps_recent_consumer_sessions_from_other_consumers():
    cache = FetchSessionCache(2)
    _session(cache, 5)
    _session(cache, 3)
    assert _session(cache, 100, now=10) == INVALID_SESSION_ID
    assert len(cache) == 2 and cache.evictions == 0


def test_a_follower_evicts_the_smallest_consumer_session_at_once():
    cache = FetchSessionCache(2)
    large, small = _session(cache, 5), _session(cache, 3)
    follower = _session(cache, 1, privileged=True, now=10)
    assert follower != INVALID_SESSION_ID and cache.evictions == 1
    assert cache.get(small) is None and cache.get(large) is not None
    assert cache.total_partitions == 6


def test_a_consumer_session_past_the_eviction_time_yields_to_a_larger_one():
    cache = FetchSessionCache(1)
    old = _session(cache, 3)
    later = EVICTION_MS + 10
    incremental(cache, old, 1, now=later)  # used: not stale, but now old enough to be evictable
    assert _session(cache, 3, now=later + 1) == INVALID_SESSION_ID  # no larger: may not
    assert _session(cache, 4, now=later + 1) != INVALID_SESSION_ID  # larger: may
    assert cache.get(old) is None


def test_follower_sessions_are_privileged():
    cache = FetchSessionCache(1)
    follower = _session(cache, 3, privileged=True)
    assert _session(cache, 1, privileged=True, now=10) == INVALID_SESSION_ID  # too young
    later = EVICTION_MS + 10
    incremental(cache, follower, 1, now=later, privileged=True)
    assert _session(cache, 1000, now=later + 1) == INVALID_SESSION_ID  # a consumer never may
    assert _session(cache, 3, privileged=True, now=later + 1) == INVALID_SESSION_ID  # no larger
    assert _session(cache, 4, privileged=True, now=later + 1) != INVALID_SESSION_ID
    assert cache.get(follower) is None


def test_the_least_recently_used_stale_session_goes_first_whoever_asks():
    cache = FetchSessionCache(3)
    follower = _session(cache, 50, privileged=True, now=0)
    a, b = _session(cache, 50, now=5), _session(cache, 50, now=6)
    incremental(cache, a, 1, now=EVICTION_MS)  # a and b used since; the follower's is stale
    incremental(cache, b, 1, now=EVICTION_MS)
    new = _session(cache, 1, now=EVICTION_MS + 1)
    assert new != INVALID_SESSION_ID and cache.get(follower) is None
    assert cache.get(a) is not None and cache.get(b) is not None
    # Once all are stale, the least recently used goes: a (last used before new and b).
    incremental(cache, b, 2, now=EVICTION_MS + 2)
    assert _session(cache, 1, now=3 * EVICTION_MS) != INVALID_SESSION_ID
    assert cache.get(a) is None and cache.get(b) is not None and cache.get(new) is not None


# The fetcher's side (FetchSessionHandler), as Ottla's followers use it.

def test_the_handler_sends_everything_until_a_session_exists_then_only_what_changed():
    handler = FetchSessionHandler()
    wanted = {("t", p): (0, 5) for p in range(4)}
    assert (handler.session_id, handler.epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    assert handler.build(wanted) == (list(wanted), [])
    assert handler.handle_response(ErrorCode.none, 77, list(wanted))
    assert (handler.session_id, handler.epoch) == (77, 1)
    assert handler.build(wanted) == ([], [])
    assert handler.handle_response(ErrorCode.none, 77, [])
    changed = {**wanted, ("t", 1): (3, 5), ("u", 0): (0, 5)}
    del changed[("t", 3)]
    assert handler.build(changed) == ([("t", 1), ("u", 0)], [("t", 3)])
    assert handler.handle_response(ErrorCode.none, 77, [("t", 1)])
    assert handler.epoch == 3


def test_the_handler_against_the_broker_side():
    """The two sides together: the broker's session ends up holding what the fetcher wants."""
    cache, handler = FetchSessionCache(5), FetchSessionHandler()

    def round_trip(offsets, answers=None):
        send, forget = handler.build(offsets)
        context = Opened(new_context(cache, V12, handler.session_id, handler.epoch, True,
                                     {key: wanted(offsets[key]) for key in send}, forget, 0))
        error, session_id, kept = context.finish(read(context, answers or {}), 0)
        assert handler.handle_response(error, session_id, kept)
        return send, kept, {key: position(params) for key, params in context.partitions()}

    start = {("t", p): 0 for p in range(3)}
    assert round_trip(start)[0] == list(start)
    send, kept, read_at = round_trip(start)
    assert (send, kept, read_at) == ([], [], start)
    moved = {**start, ("t", 2): 4}
    send, kept, read_at = round_trip(moved, {("t", 2): outcome(10, records=b"r")})
    assert (send, kept, read_at) == ([("t", 2)], [("t", 2)], moved)
    assert cache.get(handler.session_id).privileged


def test_the_handler_starts_over_after_errors():
    handler = FetchSessionHandler()
    handler.build({("t", 0): 1})
    handler.handle_response(ErrorCode.none, 9, [("t", 0)])
    handler.build({("t", 0): 1})
    assert not handler.handle_response(ErrorCode.invalid_fetch_session_epoch, 0, [])
    assert (handler.session_id, handler.epoch) == (9, INITIAL_EPOCH)  # full, closing session 9
    assert handler.build({("t", 0): 1}) == ([("t", 0)], [])
    assert handler.handle_response(ErrorCode.none, 10, [("t", 0)]) and handler.session_id == 10
    handler.build({("t", 0): 1})
    assert not handler.handle_response(ErrorCode.fetch_session_id_not_found, 0, [])
    assert (handler.session_id, handler.epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    handler.build({("t", 0): 1})
    handler.handle_response(ErrorCode.none, 11, [("t", 0)])
    handler.build({("t", 0): 1})
    assert not handler.handle_response(ErrorCode.none, 11, [("x", 9)])  # names what it was never asked
    assert handler.epoch == INITIAL_EPOCH
    handler.build({("t", 0): 1})
    handler.handle_error()
    assert handler.epoch == INITIAL_EPOCH
    # A full answer that omits a partition is not trusted either.
    handler.build({("t", 0): 1, ("t", 1): 1})
    assert not handler.handle_response(ErrorCode.none, 12, [("t", 0)])
    assert (handler.session_id, handler.epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
