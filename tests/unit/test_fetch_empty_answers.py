"""A Fetch answered with no records and no error (a long poll that timed out, a follower's
fetch with nothing new) says the same thing round after round: its body is encoded once and
reused (`handlers/fetch._encoded_if_empty`). Reused only while it says the same: a moved high
watermark or log start offset, or another session, must give a new body, byte for byte what
kio encodes for the answer built in full."""

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace

from kio.schema.fetch.v11 import request as fetch11
from kio.schema.fetch.v11.response import FetchResponse
from kio.serial import entity_reader

from ottla.config import BrokerConfig
from ottla.protocol.codec import EncodedBody, encode_item
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker


def _request(offsets: tuple[int, int]) -> fetch11.FetchRequest:
    return fetch11.FetchRequest(
        replica_id=-1, max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, forgotten_topics_data=(), rack_id="",
        topics=(fetch11.FetchTopic(topic="t", partitions=(
            fetch11.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                                   partition_max_bytes=1 << 20) for p, offset in enumerate(offsets))),))


def _fetch(broker, *offsets: int):
    from ottla.server.handlers import fetch

    ctx = SimpleNamespace(broker=broker, api_version=11, response_type=FetchResponse)
    return asyncio.run(fetch.handle(ctx, _request(offsets)))


def _decoded(body: bytes) -> FetchResponse:
    response, _ = entity_reader(FetchResponse)(body, 0)
    return response


def test_an_empty_answer_is_encoded_once_and_follows_the_offsets(tmp_path):
    broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
    broker.create_topic("t", 2, {})

    first, again = _fetch(broker, 0, 0), _fetch(broker, 0, 0)
    assert isinstance(first, EncodedBody)
    assert again is first  # reused, not built and encoded again
    assert [(p.partition_index, p.high_watermark) for p in _decoded(first).responses[0].partitions] == [(0, 0), (1, 0)]

    broker.replicas.append("t", 1, build_batch([Record(None, b"v")]), now_ms=int(time.time() * 1000))
    caught_up = _fetch(broker, 0, 1)  # both at their end: nothing to send, partition 1's HW moved
    assert isinstance(caught_up, EncodedBody) and caught_up != first
    answer = _decoded(caught_up)
    assert [(p.partition_index, p.high_watermark, bytes(p.records)) for p in answer.responses[0].partitions] == [
        (0, 0, b""), (1, 1, b"")]
    assert bytes(caught_up) == encode_item(answer)  # what kio writes for the same answer

    with_records = _fetch(broker, 0, 0)  # partition 1 has a record at 0: built as before
    assert not isinstance(with_records, EncodedBody)
    assert bytes(with_records.responses[0].partitions[1].records)


def test_the_encoded_answers_held_stay_within_their_byte_bound(tmp_path, monkeypatch):
    """Each moved high watermark makes a new answer: what is kept is bounded in bytes, not in
    answers (one answer for 1,000 partitions is some 37 KB with a key several times that)."""
    from ottla.server.handlers import fetch

    monkeypatch.setattr(fetch, "_EMPTY_ANSWERS", {})
    monkeypatch.setattr(fetch, "_empty_answers_held", [0])
    monkeypatch.setattr(fetch, "_EMPTY_ANSWERS_BYTES", 1000)
    broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
    broker.create_topic("t", 2, {})
    for offset in range(12):
        answer = _fetch(broker, offset, offset)
        assert isinstance(answer, EncodedBody)
        held = sum(len(body) + fetch._KEY_BYTES_PER_PARTITION * (len(key) - 3)
                   for key, body in fetch._EMPTY_ANSWERS.items())
        assert held == fetch._empty_answers_held[0] <= 1000
        for partition in (0, 1):
            broker.replicas.append("t", partition, build_batch([Record(None, b"v")]), now_ms=int(time.time() * 1000))
