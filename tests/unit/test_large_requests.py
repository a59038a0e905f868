"""Fetch, OffsetForLeaderEpoch and DeleteRecords naming thousands of partitions must not hold
the event loop (issue 11, F3): naming 200,000 partitions, each held it for 0.7-1.8 s of CPU in
one step. Their handlers give the loop a turn every 256 partitions (`server/steps.py`), and a
Fetch that waits after such a read still sees what was appended between its steps.

In process: a real broker, the handlers called as the network calls them; each fetch that
waits has a max_wait of an hour and the test's own guard (`ANSWERED`) fails it as never
answered."""

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from kio.schema.delete_records.v1 import request as delete_records1
from kio.schema.delete_records.v1.response import DeleteRecordsResponse
from kio.schema.fetch.v11 import request as fetch11
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.offset_for_leader_epoch.v3 import request as epochs3
from kio.schema.offset_for_leader_epoch.v3.response import OffsetForLeaderEpochResponse

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.records.records import Record, build_batch, decode_batch
from ottla.server.broker import Broker
from ottla.server.handlers import delete_records, fetch, offset_for_leader_epoch
from ottla.server.steps import ENTRIES_PER_STEP
from tests.loop_turns import with_turns

PARTITIONS = 20_000
HOUR = timedelta(hours=1)
ANSWERED = 30.0  # seconds: a guard against a fetch that is never answered, not a speed assertion


def _fetch(topic: str, partitions: range, max_wait: timedelta) -> fetch11.FetchRequest:
    return fetch11.FetchRequest(
        replica_id=-1, max_wait=max_wait, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(fetch11.FetchTopic(topic=topic, partitions=tuple(
            fetch11.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                                   partition_max_bytes=1 << 20) for p in partitions)),))


def _epochs() -> epochs3.OffsetForLeaderEpochRequest:
    return epochs3.OffsetForLeaderEpochRequest(replica_id=-1, topics=(epochs3.OffsetForLeaderTopic(
        topic="x", partitions=tuple(epochs3.OffsetForLeaderPartition(partition=p, current_leader_epoch=-1,
                                                                     leader_epoch=0) for p in range(PARTITIONS))),))


def _delete() -> delete_records1.DeleteRecordsRequest:
    return delete_records1.DeleteRecordsRequest(timeout=timedelta(seconds=30), topics=(delete_records1.DeleteRecordsTopic(
        name="x", partitions=tuple(delete_records1.DeleteRecordsPartition(partition_index=p, offset=0)
                                   for p in range(PARTITIONS))),))


CASES = {  # handler, version, response type, request, the errors of its partitions (0 exists, the others not)
    "Fetch v11": (fetch, 11, FetchResponse, lambda: _fetch("x", range(PARTITIONS), HOUR),
                  lambda r: [(p.partition_index, p.error_code) for t in r.responses for p in t.partitions]),
    "OffsetForLeaderEpoch v3": (offset_for_leader_epoch, 3, OffsetForLeaderEpochResponse, _epochs,
                                lambda r: [(p.partition, p.error_code) for t in r.topics for p in t.partitions]),
    "DeleteRecords v1": (delete_records, 1, DeleteRecordsResponse, _delete,
                         lambda r: [(p.partition_index, p.error_code) for t in r.topics for p in t.partitions]),
}


@pytest.mark.parametrize("api", list(CASES))
def test_a_request_naming_many_partitions_is_answered_in_steps(tmp_path, api):
    handler, version, response_type, request, answers = CASES[api]

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            broker.create_topic("x", 1, {})
            return await with_turns(asyncio.wait_for(handler.handle(
                SimpleNamespace(broker=broker, api_version=version, response_type=response_type), request()), ANSWERED))
        finally:
            broker.logs.close()
            broker.release_data_dir()

    turns, response = asyncio.run(scenario())
    found = answers(response)
    assert [p for p, _ in found] == list(range(PARTITIONS))
    assert found[0][1] == ErrorCode.none
    assert {error for _, error in found[1:]} == {ErrorCode.unknown_topic_or_partition}
    # 256 partitions handled between two turns of the loop: the others ran.
    assert turns >= PARTITIONS // ENTRIES_PER_STEP


def test_a_fetch_read_in_steps_sees_an_append_made_between_them(tmp_path):
    """The fetch watches its partitions only once it has read them all and found nothing; an
    append to partition 0 after it was read, while the loop ran others between two steps of
    the read, woke nothing, and the fetch waited out its max_wait (an hour here)."""
    partitions = 3 * ENTRIES_PER_STEP

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            broker.create_topic("w", partitions, {})
            recordings = broker.replicas.delayed_fetches.recording
            reading = asyncio.Event()

            def recording():
                reading.set()
                return recordings()
            broker.replicas.delayed_fetches.recording = recording
            fetching = asyncio.create_task(fetch.handle(
                SimpleNamespace(broker=broker, api_version=11, response_type=FetchResponse),
                _fetch("w", range(partitions), HOUR)))
            await reading.wait()
            await asyncio.sleep(0)  # the next turn: partition 0 read, most others not yet
            assert not broker.replicas.delayed_fetches.watching(("w", 0))  # the fetch reads, not waits
            broker.replicas.append("w", 0, build_batch([Record(None, b"between")]), now_ms=int(time.time() * 1000))
            return await asyncio.wait_for(fetching, ANSWERED)
        finally:
            broker.logs.close()
            broker.release_data_dir()

    response = asyncio.run(scenario())
    records = {p.partition_index: bytes(p.records or b"") for t in response.responses for p in t.partitions}
    assert [record.value for record in decode_batch(records[0])] == [b"between"]
