"""A fetch session of many partitions (KIP-227) is made, used and answered in steps (issue
11, F3): creating one of 200,000 partitions held the event loop for 160-180 ms of CPU in one
step, and each incremental fetch on it 110-150 ms. In steps, what the fetcher is told must be
exactly what the one-step walk told it.

In process: a real broker, the Fetch handler called as the network calls it."""

import asyncio
import gc
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

from kio.schema.fetch.v11 import request as fetch11
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.fetch.v13 import request as fetch13_request
from kio.schema.fetch.v13.response import FetchResponse as FetchResponse13
from kio.serial import entity_reader

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.fetch_sessions import PARTITIONS_PER_SLOT, CachedPartition
from ottla.records.records import Record, build_batch, decode_batch
from ottla.server import steps
from ottla.server.broker import Broker
from ottla.server.handlers import fetch
from tests.loop_turns import most_objects_between_turns, seen_between_turns

ANSWERED = 30.0  # seconds: a guard against a fetch that is never answered, not a speed assertion


def _fetch(session_id: int, epoch: int, partitions=(), offsets=None, forget=(), replica_id=-1,
           max_wait=timedelta(0)) -> fetch11.FetchRequest:
    offsets = offsets or {}
    return fetch11.FetchRequest(
        replica_id=replica_id, max_wait=max_wait, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=session_id, session_epoch=epoch, rack_id="",
        forgotten_topics_data=(fetch11.ForgottenTopic(topic="x", partitions=tuple(forget)),) if forget else (),
        topics=(fetch11.FetchTopic(topic="x", partitions=tuple(fetch11.FetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=offsets.get(p, 0), log_start_offset=-1,
            partition_max_bytes=1 << 20) for p in partitions)),) if partitions else ())


async def _handle(broker, request):
    response = await asyncio.wait_for(fetch.handle(
        SimpleNamespace(broker=broker, api_version=11, response_type=FetchResponse), request), ANSWERED)
    if isinstance(response, bytes):  # an answer with nothing in it, encoded once
        response, _ = entity_reader(FetchResponse)(response, 0)
    return response


def _answered(response) -> list[tuple]:
    return [(t.topic, p.partition_index, p.error_code, p.high_watermark, p.log_start_offset,
             [r.value for r in decode_batch(bytes(p.records))] if p.records else [])
            for t in response.responses for p in t.partitions]


def _with_broker(tmp_path, partitions: int, scenario, config=None):
    async def run():
        broker = Broker(tmp_path, BrokerConfig(config or {}))
        try:
            broker.create_topic("x", partitions, {})
            return await scenario(broker)
        finally:
            broker.logs.close()
            broker.release_data_dir()
    return asyncio.run(run())


def test_a_session_of_many_partitions_is_made_used_and_let_go_of_in_steps(tmp_path):
    """20,000 partitions, all but partition 0 unknown, and a cache with room for 20,000.
    Counted in objects made or freed between two turns of the loop: on the old code the
    session's 20,000 cached partitions were made in one step, an incremental fetch freed its
    20,000 outcomes in one, and closing or evicting the session freed it in one."""
    partitions = 20_000

    async def scenario(broker):
        most = {}

        async def measured(name, request):  # the request is kept: the network frees it, not the handler
            blocks, response = await seen_between_turns(_handle(broker, request), sys.getallocatedblocks)
            most[name] = most_objects_between_turns(blocks)
            return response

        created = await measured("create", _fetch(0, 0, range(partitions)))
        again = await measured("incremental", _fetch(created.session_id, 1))
        await measured("close", _fetch(created.session_id, -1, (0,)))
        closed = broker.fetch_sessions.get(created.session_id)
        recreated = await measured("create again", _fetch(0, 0, range(partitions)))
        follower = await measured("evict", _fetch(0, 0, (0,), replica_id=1))
        evicted = broker.fetch_sessions.get(recreated.session_id)
        return created, again, closed, follower, evicted, most

    created, again, closed, follower, evicted, most = _with_broker(
        tmp_path, 1, scenario, {"max.incremental.fetch.session.cache.slots": partitions // PARTITIONS_PER_SLOT})
    assert created.error_code == ErrorCode.none and created.session_id != 0
    assert [p for _, p, *_ in _answered(created)] == list(range(partitions))
    assert again.error_code == ErrorCode.none and again.session_id == created.session_id
    # Partition 0 has nothing new; the unknown ones are named again with their error.
    assert [(p, error) for _, p, error, *_ in _answered(again)] == [
        (p, ErrorCode.unknown_topic_or_partition) for p in range(1, partitions)]
    assert closed is None and evicted is None and follower.session_id != 0
    # A step handles ENTRIES_PER_STEP partitions: a few objects each, far from 20,000.
    assert all(made < partitions // 4 for made in most.values()), most


def _session_life(tmp_path, partitions: int, looked: list):
    """A consumer's session of all `partitions` of `x`, through records appended to the even
    ones, an incremental fetch that changes three positions and forgets two, a duplicate
    request, a close, and a request on the closed session: each answer, and the session's
    order after each incremental fetch. `looked` gets, at each turn the loop gives others
    during the first incremental fetch, how many partitions the session has been told the new
    high watermark of."""

    async def scenario(broker):
        answers, orders = [], []
        cache = broker.fetch_sessions

        def record(response):
            answers.append((response.error_code, response.session_id != 0, _answered(response)))

        created = await _handle(broker, _fetch(0, 0, range(partitions)))
        record(created)
        session = cache.get(created.session_id)
        for p in range(0, partitions, 2):
            broker.replicas.append("x", p, build_batch([Record(None, b"v%d" % p)]), now_ms=int(time.time() * 1000))

        def told():
            return sum(CachedPartition(*cached).high_watermark == 1 for cached in session.partitions.values())
        seen, answered = await seen_between_turns(_handle(broker, _fetch(created.session_id, 1)), told)
        looked.extend(seen)
        record(answered)
        orders.append(list(session.partitions))
        broker.replicas.append("x", 3, build_batch([Record(None, b"late")]), now_ms=int(time.time() * 1000))
        record(await _handle(broker, _fetch(created.session_id, 2, (0, 1, 3), {0: 1, 1: 0, 3: 0}, forget=(5, 7))))
        orders.append(list(session.partitions))
        record(await _handle(broker, _fetch(created.session_id, 2)))  # the same epoch again
        record(await _handle(broker, _fetch(created.session_id, -1, (0,))))  # closes it
        record(await _handle(broker, _fetch(created.session_id, 3)))
        return answers, orders

    return _with_broker(tmp_path, partitions, scenario)


def test_a_session_answered_in_steps_tells_what_one_step_told(tmp_path, monkeypatch):
    """The same life of a session twice: with the loop given a turn every ENTRIES_PER_STEP
    partitions, and with the whole request in one step. The answers (partitions named, their
    order, errors, session ids and epochs) and the session's partition order are the same; and
    in steps, other clients got turns while the incremental answer was being worked out (the
    session told some partitions' new high watermark and not yet the others')."""
    partitions = 2 * steps.ENTRIES_PER_STEP
    stepped_looks, one_step_looks = [], []
    stepped = _session_life(tmp_path / "stepped", partitions, stepped_looks)
    monkeypatch.setattr(steps, "ENTRIES_PER_STEP", 1 << 30)
    one_step = _session_life(tmp_path / "one-step", partitions, one_step_looks)

    answers, orders = stepped
    assert (answers, orders) == one_step
    evens, odds = list(range(0, partitions, 2)), list(range(1, partitions, 2))
    assert [a[:2] for a in answers] == [(ErrorCode.none, True), (ErrorCode.none, True), (ErrorCode.none, True),
                                        (ErrorCode.invalid_fetch_session_epoch, False), (ErrorCode.none, False),
                                        (ErrorCode.fetch_session_id_not_found, False)]
    assert [p for _, p, *_ in answers[1][2]] == evens  # only those with something new
    assert answers[1][2][0] == ("x", 0, ErrorCode.none, 1, 0, [b"v0"])
    assert orders[0] == [("x", p) for p in odds + evens]  # those that returned records go last
    # Partition 0 read from 1 (its end) has nothing new, 1 from 0 neither; 3 has its record and
    # the other even ones theirs again (their cached position is still 0).
    assert [(p, values) for _, p, _, _, _, values in answers[2][2]] == [(3, [b"late"])] + [
        (p, [b"v%d" % p]) for p in evens[1:]]
    assert orders[1] == [("x", p) for p in odds if p not in (3, 5, 7)] + [("x", p) for p in [0, 3] + evens[1:]]
    assert any(0 < n < partitions // 2 for n in stepped_looks)
    assert all(n in (0, partitions // 2) for n in one_step_looks)  # the observation itself


def test_a_live_v13_session_adds_no_objects_to_the_collectors_walks(tmp_path):
    """issue 11, as `test_fetch_sessions.py::test_a_live_session_adds_no_objects_to_the_collectors_walks`
    for Fetch v13+, whose sessions key partitions by topic id (KIP-516): a `uuid.UUID` in each
    key kept every key tracked by the cyclic collector, one object per partition in each full
    collection's walk. A session of 20,000 made by a Fetch v13 and used by an incremental one
    leaves no key or entry the collector tracks, nor 20,000 more tracked objects."""
    partitions = 20_000

    def fetch13(topic_id, session_id, epoch, count):
        return fetch13_request.FetchRequest(
            replica_id=-1, max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            session_id=session_id, session_epoch=epoch, rack_id="", forgotten_topics_data=(),
            topics=(fetch13_request.FetchTopic(topic_id=topic_id, partitions=tuple(fetch13_request.FetchPartition(
                partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=1 << 20) for p in range(count))),) if count else ())

    async def scenario(broker):
        async def handle(request):
            return await asyncio.wait_for(fetch.handle(
                SimpleNamespace(broker=broker, api_version=13, response_type=FetchResponse13), request), ANSWERED)

        topic_id = broker.metadata.topic("x").topic_id
        create = fetch13(topic_id, 0, 0, partitions)  # kept: the network frees it, not the handler
        gc.collect()
        tracked = len(gc.get_objects())
        session_id = (await handle(create)).session_id
        assert session_id != 0
        again = await handle(fetch13(topic_id, session_id, 1, 0))
        assert again.error_code == ErrorCode.none and len(again.responses[0].partitions) == partitions - 1
        assert again.responses[0].topic_id == topic_id
        del again
        gc.collect()
        cached = broker.fetch_sessions.get(session_id).partitions
        return ([key for key, entry in cached.items() if gc.is_tracked(key) or gc.is_tracked(entry)],
                len(gc.get_objects()) - tracked, len(cached))

    still_tracked, added, size = _with_broker(
        tmp_path, 1, scenario, {"max.incremental.fetch.session.cache.slots": partitions // PARTITIONS_PER_SLOT})
    assert size == partitions
    assert still_tracked == []
    assert added < 100, added  # the session, its lock: not one per partition


def test_a_fetch_waiting_on_a_session_holds_no_tracked_object_per_partition(tmp_path):
    """issue 11: an incremental fetch on a live session long-polls most of the time (a caught-up
    consumer), and while it waits a full collection walks what it holds. It held a
    `CachedPartition` view per partition (a tuple subclass: always tracked) and the wait a
    dict per partition (its watchers, holding its future): some 2,000 tracked objects for a
    session of 1,000. Now a few dozen, whatever the session's size."""
    partitions = 1_000

    async def scenario(broker):
        session_id = (await _handle(broker, _fetch(0, 0, range(partitions)))).session_id
        assert session_id != 0
        delayed = broker.replicas.delayed_fetches
        request = _fetch(session_id, 1, max_wait=timedelta(seconds=ANSWERED))  # caught up: it waits
        gc.collect()
        tracked = len(gc.get_objects())
        waiting = asyncio.ensure_future(_handle(broker, request))
        while not delayed.watching(("x", partitions - 1)):
            await asyncio.sleep(0)
        gc.collect()
        held = len(gc.get_objects()) - tracked
        broker.replicas.append("x", 7, build_batch([Record(None, b"wake")]), now_ms=int(time.time() * 1000))
        return held, _answered(await waiting), [delayed.watching(("x", p)) for p in range(partitions)]

    held, answered, watching = _with_broker(tmp_path, partitions, scenario)
    assert answered == [("x", 7, ErrorCode.none, 1, 0, [b"wake"])]
    assert set(watching) == {0}
    assert held < 100, held
