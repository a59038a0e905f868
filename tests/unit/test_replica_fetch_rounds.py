"""One acks=all replication round on a leader whose followers fetch in incremental sessions of
many partitions (issue 13): an acks=all produce is answered once every ISR follower's next
fetch has told the leader it has the batch. Those fetches name only the partition that
moved, but the leader's read walks the whole session a few hundred partitions per turn of
the event loop; on a loaded broker the turns, not the work, made the round. These tests count
turns of the loop (and what a fetch reads), never time.

In process: broker 0 leads `w` (PARTITIONS partitions, more than a handler's step), followers
1 and 2 in the ISR, each with a fetch session made by a full Fetch v12."""

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace

from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v12.response import FetchResponse

from kio.serial import entity_reader

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.protocol.codec import EncodedBody
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.handlers import fetch
from ottla.server.metadata_cache import PartitionState
from ottla.server.steps import ENTRIES_PER_STEP

PARTITIONS = 2 * ENTRIES_PER_STEP
EPOCH = 1


def _broker(tmp_path) -> Broker:
    broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
    broker.create_topic("w", PARTITIONS, {"min.insync.replicas": "2"})
    broker.replicas.apply_partition_states(
        [PartitionState("w", p, 0, EPOCH, (0, 1, 2), (0, 1, 2)) for p in range(PARTITIONS)])
    return broker


def _ctx(broker):
    return SimpleNamespace(broker=broker, api_version=12, response_type=FetchResponse)


def _request(replica_id: int, offsets: dict[int, int], session_id: int = 0, session_epoch: int = 0,
             min_bytes: int = 0, max_wait: timedelta = timedelta(0)) -> fetch12.FetchRequest:
    return fetch12.FetchRequest(
        cluster_id=None, replica_id=replica_id, max_wait=max_wait, min_bytes=min_bytes, max_bytes=1 << 20,
        isolation_level=0, session_id=session_id, session_epoch=session_epoch, forgotten_topics_data=(),
        rack_id="", topics=(fetch12.FetchTopic(topic="w", partitions=tuple(
            fetch12.FetchPartition(partition=p, current_leader_epoch=EPOCH, fetch_offset=offset,
                                   last_fetched_epoch=EPOCH if offset else -1, log_start_offset=0,
                                   partition_max_bytes=1 << 20)
            for p, offset in offsets.items())),) if offsets else ())


async def _handle(broker, request) -> FetchResponse:
    response = await fetch.handle(_ctx(broker), request)
    if isinstance(response, EncodedBody):  # an empty answer, encoded once and kept
        response, _ = entity_reader(FetchResponse)(bytes(response), 0)
    return response


async def _session(broker, replica_id: int) -> int:
    """A follower's session of every partition, all at offset 0 (a full fetch)."""
    response = await _handle(broker, _request(replica_id, {p: 0 for p in range(PARTITIONS)}))
    assert response.error_code == ErrorCode.none and response.session_id > 0
    return response.session_id


def _produce(broker, partition: int) -> asyncio.Task:
    """An acks=all produce of one record: done once the HW passed it."""
    return asyncio.get_running_loop().create_task(broker.replicas.append_records(
        {("w", partition): build_batch([Record(None, b"v")])}, acks=-1, timeout_ms=3_600_000,
        now_ms=int(time.time() * 1000)))


def test_a_followers_incremental_fetch_moves_the_hw_before_the_handler_gives_the_loop_a_turn(tmp_path):
    """Without telling the progress first, the fetch reached the partition only after walking
    the session in steps: the produce was still waiting after the handler's first turn."""
    broker = _broker(tmp_path)
    moved = PARTITIONS - 1

    async def scenario():
        sessions = {r: await _session(broker, r) for r in (1, 2)}
        produce = _produce(broker, moved)
        await asyncio.sleep(0)  # appended; waits for the followers
        log = broker.replicas.get_partition("w", moved).log
        assert log.log_end_offset == 1 and log.high_watermark == 0
        first = await _handle(broker, _request(1, {moved: 0}, sessions[1], 1))
        assert [p.partition_index for t in first.responses for p in t.partitions if p.records] == [moved]
        await _handle(broker, _request(2, {moved: 0}, sessions[2], 1))
        assert log.high_watermark == 0
        # Both followers now have the batch; follower 1's next fetch says so first.
        await _handle(broker, _request(1, {moved: 1}, sessions[1], 2))
        assert log.high_watermark == 0  # follower 2 has not told yet
        second = asyncio.get_running_loop().create_task(
            _handle(broker, _request(2, {moved: 1}, sessions[2], 2)))
        await asyncio.sleep(0)  # the handler's first step, up to its first turn of the loop
        assert log.high_watermark == 1
        assert (await produce)[("w", moved)].error == ErrorCode.none
        await second

    asyncio.run(scenario())
    broker.logs.close()


def test_a_followers_incremental_fetch_with_nothing_new_reads_no_caught_up_partition_and_tells_its_progress(tmp_path):
    """The follower is at the log end of every partition of its session: the read finds nothing
    anywhere, and the leader now leaves them all out (but takes the fetch as the follower's
    progress on each, so the ISR check sees it caught up). Reading them walked the session a
    few hundred partitions per turn of the loop: the answer was not there after the first."""
    broker = _broker(tmp_path)

    async def scenario():
        session = await _session(broker, 1)
        progress = broker.replicas.get_partition("w", 5).followers[1]
        progress.last_caught_up_ms = progress.last_fetch_ms = 0
        answering = asyncio.get_running_loop().create_task(_handle(broker, _request(1, {}, session, 1)))
        await asyncio.sleep(0)  # the handler's first step
        assert answering.done()
        response = await answering
        assert response.error_code == ErrorCode.none and response.session_id == session
        assert [p for t in response.responses for p in t.partitions] == []
        assert progress.last_caught_up_ms > 0 and progress.last_fetch_ms > 0

    asyncio.run(scenario())
    broker.logs.close()


def test_a_followers_fetch_waiting_on_caught_up_partitions_is_answered_by_an_append_and_told_a_new_hw(tmp_path):
    """Partitions left out of the read are watched all the same: an append to one wakes the
    fetch and the answer carries it; a HW that moved since the follower was last told makes the
    partition part of its next answer."""
    broker = _broker(tmp_path)
    appended = 7

    async def scenario():
        sessions = {r: await _session(broker, r) for r in (1, 2)}
        waiting = asyncio.get_running_loop().create_task(
            _handle(broker, _request(1, {}, sessions[1], 1, min_bytes=1, max_wait=timedelta(hours=1))))
        while not broker.replicas.delayed_fetches.watching(("w", appended)):
            assert not waiting.done()
            await asyncio.sleep(0)
        produce = _produce(broker, appended)
        answered = await asyncio.wait_for(waiting, 30)  # a guard, not a speed assertion
        assert [(p.partition_index, p.high_watermark, bool(p.records))
                for t in answered.responses for p in t.partitions] == [(appended, 0, True)]
        await _handle(broker, _request(1, {appended: 1}, sessions[1], 2))
        await _handle(broker, _request(2, {appended: 0}, sessions[2], 1))
        await _handle(broker, _request(2, {appended: 1}, sessions[2], 2))  # both have it: the HW moves
        assert (await produce)[("w", appended)].error == ErrorCode.none
        told = await _handle(broker, _request(1, {}, sessions[1], 3))
        assert [(p.partition_index, p.high_watermark, bool(p.records))
                for t in told.responses for p in t.partitions] == [(appended, 1, False)]
        again = await _handle(broker, _request(1, {}, sessions[1], 4))
        assert [p for t in again.responses for p in t.partitions] == []

    asyncio.run(scenario())
    broker.logs.close()


def test_the_produce_a_followers_fetch_completes_is_answered_before_that_fetch_reads_its_session(tmp_path):
    """The HW move completes the acks=all produce; the fetch that moved it then reads the rest
    of the session (a few hundred partitions) and answers. The produce goes first: before, the
    fetch's read ran in the same step and the produce waited for it (asyncio.wait also took one
    turn more to resume it)."""
    broker = _broker(tmp_path)
    moved = 3

    async def scenario():
        sessions = {r: await _session(broker, r) for r in (1, 2)}
        produce = _produce(broker, moved)
        await asyncio.sleep(0)
        for replica in (1, 2):
            await _handle(broker, _request(replica, {moved: 0}, sessions[replica], 1))
        await _handle(broker, _request(1, {moved: 1}, sessions[1], 2))
        order = []
        produce.add_done_callback(lambda _: order.append("produce answered"))
        telling = asyncio.get_running_loop().create_task(_handle(broker, _request(2, {moved: 1}, sessions[2], 2)))
        telling.add_done_callback(lambda _: order.append("fetch answered"))
        await asyncio.gather(produce, telling)
        assert order == ["produce answered", "fetch answered"]
        assert broker.replicas.get_partition("w", moved).log.high_watermark == 1

    asyncio.run(scenario())
    broker.logs.close()
