"""A delayed Fetch (nothing to read yet, min_bytes=1) waiting on many partitions: what wakes
it and what it answers. A follower's fetch re-reads only the partitions notified while it
waited (`DelayedFetches.wait`), so every change that can alter a partition's answer must
notify: appends, HW moves, and role changes (Kafka's makeFollowers completes the delayed
fetches of the partitions it changes). A consumer's fetch reads all again.

Each fetch waits with a max_wait of an hour: it is answered by what the test does, or the
test's own guard (`ANSWERED`) fails it as never answered."""

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v12.response import FetchResponse

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.protocol.codec import EncodedBody
from ottla.records.records import Record, build_batch, decode_batch
from ottla.server.broker import Broker
from ottla.server.handlers import fetch
from ottla.server.metadata_cache import PartitionState

PARTITIONS = 50
HOUR = timedelta(hours=1)
ANSWERED = 30.0  # seconds: a guard against a fetch that is never answered, not a speed assertion


def _now() -> int:
    return int(time.time() * 1000)


def _broker(tmp_path) -> Broker:
    """Broker 0 leading `w`'s partitions, with followers 1 and 2 in the ISR."""
    broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
    broker.create_topic("w", PARTITIONS, {})
    broker.replicas.apply_partition_states(
        [PartitionState("w", p, 0, 1, (0, 1, 2), (0, 1, 2)) for p in range(PARTITIONS)])
    return broker


def _request(offsets: dict[int, int], replica_id: int) -> fetch12.FetchRequest:
    return fetch12.FetchRequest(
        cluster_id=None, replica_id=replica_id, max_wait=HOUR, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
        topics=(fetch12.FetchTopic(topic="w", partitions=tuple(
            fetch12.FetchPartition(partition=p, current_leader_epoch=1, fetch_offset=offset, last_fetched_epoch=-1,
                                   log_start_offset=0, partition_max_bytes=1 << 20)
            for p, offset in offsets.items())),))


def _start(broker, request) -> asyncio.Task:
    ctx = SimpleNamespace(broker=broker, api_version=12, response_type=FetchResponse)
    return asyncio.get_running_loop().create_task(fetch.handle(ctx, request))


async def _waiting(broker, task, partition: int) -> None:
    """Until the fetch waits on `partition` (it read everything once and found nothing)."""
    while not broker.replicas.delayed_fetches.watching(("w", partition)):
        assert not task.done(), task.result()
        await asyncio.sleep(0.001)


def _answers(response) -> dict[int, tuple]:
    return {p.partition_index: (ErrorCode(p.error_code), p.high_watermark, bytes(p.records or b""))
            for topic in response.responses for p in topic.partitions}


def _values(records: bytes) -> list[bytes]:
    return [record.value for record in decode_batch(records)] if records else []


def test_a_follower_fetch_waiting_on_many_partitions_is_answered_with_the_one_appended_to(tmp_path):
    broker = _broker(tmp_path)

    async def scenario():
        fetching = _start(broker, _request({p: 0 for p in range(PARTITIONS)}, replica_id=1))
        await _waiting(broker, fetching, 0)
        broker.replicas.append("w", 37, build_batch([Record(None, b"to 37")]), now_ms=_now())
        return await asyncio.wait_for(fetching, ANSWERED)

    answers = _answers(asyncio.run(scenario()))
    assert _values(answers[37][2]) == [b"to 37"]
    assert all(records == b"" and error is ErrorCode.none
               for p, (error, _, records) in answers.items() if p != 37)
    assert len(answers) == PARTITIONS
    broker.logs.close()


def test_a_consumer_fetch_is_answered_when_a_follower_moves_the_high_watermark(tmp_path):
    """The HW move (a follower's fetch) is the notification; the consumer gets the records below it."""
    broker = _broker(tmp_path)

    async def scenario():
        broker.replicas.append("w", 5, build_batch([Record(None, b"v")]), now_ms=_now())
        consuming = _start(broker, _request({p: 0 for p in range(PARTITIONS)}, replica_id=-1))
        await _waiting(broker, consuming, 5)  # HW 0: nothing visible yet
        for follower in (1, 2):
            broker.replicas.follower_fetched("w", 5, follower, 1, _now())
        return await asyncio.wait_for(consuming, ANSWERED)

    answers = _answers(asyncio.run(scenario()))
    assert answers[5][1] == 1 and _values(answers[5][2]) == [b"v"]
    assert all(records == b"" for p, (_, _, records) in answers.items() if p != 5)
    broker.logs.close()


def test_a_delayed_fetch_is_answered_when_this_broker_stops_leading_a_partition(tmp_path):
    """Without the notification on a role change it waited out its max_wait (an hour here)."""
    broker = _broker(tmp_path)

    async def scenario():
        fetching = _start(broker, _request({p: 0 for p in range(PARTITIONS)}, replica_id=1))
        await _waiting(broker, fetching, 12)
        broker.replicas.apply_partition_states([PartitionState("w", 12, 2, 2, (0, 1, 2), (1, 2))])
        return await asyncio.wait_for(fetching, ANSWERED)

    answers = _answers(asyncio.run(scenario()))
    assert answers[12][0] is ErrorCode.fenced_leader_epoch  # the fetch named epoch 1, the partition is at 2
    assert all(error is ErrorCode.none for p, (error, _, _) in answers.items() if p != 12)
    broker.logs.close()


@pytest.mark.parametrize("leader_before", [1, 0], ids=["new leader", "new epoch of its leadership"])
def test_a_followers_waiting_fetch_is_answered_when_this_broker_starts_leading_another_partition_it_replicates(
        tmp_path, leader_before):
    """The follower has to ask for that partition (truncation, then a fetch in the new epoch) and
    sends one request at a time: without the completion its fetch of the others waited out its
    max_wait (an hour here; 500 ms by default, which after a controlled shutdown held acks=all
    on the handed-over partition). A consumer's fetch and another follower's keep waiting. The
    same when this broker led the partition already and a new epoch of it starts."""
    broker = _broker(tmp_path)
    broker.create_topic("n", 1, {})
    broker.replicas.apply_partition_states([PartitionState("n", 0, leader_before, 1, (0, 1), (0, 1))])

    async def scenario():
        follower = _start(broker, _request({p: 0 for p in range(PARTITIONS)}, replica_id=1))
        other = _start(broker, _request({0: 0}, replica_id=2))  # not a replica of n-0
        consumer = _start(broker, _request({0: 0}, replica_id=-1))
        for task in (follower, other, consumer):
            await _waiting(broker, task, 0)
        await asyncio.sleep(0.05)
        assert not (follower.done() or other.done() or consumer.done())
        broker.replicas.apply_partition_states([PartitionState("n", 0, 0, 2, (0, 1), (0, 1))])
        answered = await asyncio.wait_for(follower, ANSWERED)
        await asyncio.sleep(0.05)  # the other two would be answered in the same loop turns
        still_waiting = not other.done() and not consumer.done()
        other.cancel()
        consumer.cancel()
        return answered, still_waiting

    answered, still_waiting = asyncio.run(scenario())
    assert isinstance(answered, EncodedBody)  # answered with nothing in it and no error
    assert still_waiting
    broker.logs.close()
