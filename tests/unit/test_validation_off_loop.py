"""A produced batch that takes long to check is checked in a worker thread, not on the event
loop (issue 11, F3): a gzip bomb inflating to the bound (32 x max.message.bytes) held the loop
for 0.4-0.7 s of CPU, and every other client with it. In process: a real broker, Produce's
real handler; the other client is another Produce on the same loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import timedelta

from kio.schema.produce.v7.request import PartitionProduceData, ProduceRequest, TopicProduceData

from ottla.config import BrokerConfig
from ottla.log import append_settings
from ottla.protocol.build import make, nested
from ottla.protocol.codec import decode_request
from ottla.protocol.schemas import request_schema
from ottla.records import compression, validator
from ottla.records.batch import read_header
from ottla.records.records import Record, build_batch, decode_batch
from ottla.records.validator import inflate_limit
from ottla.server.broker import Broker
from ottla.server.context import RequestContext
from ottla.server.handlers import produce
from tests.unit.test_record_validator import _gzip_bomb, with_header
from tests.unit.test_records_legacy import _legacy_set
from tests.wire import encode_request

MAX_MESSAGE_BYTES = 1 << 20


def _request(topic: str, batch: bytes):
    request = ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=30), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)),))
    return decode_request(encode_request(request)[4:], {0: (0, 13)})


def _context(broker, request):
    return RequestContext(broker, 0, 7, request.header, "c", "127.0.0.1")


@contextlib.contextmanager
def _broker(tmp_path, config=None):
    broker = Broker(tmp_path, BrokerConfig(config or {}))
    try:
        yield broker
    finally:
        broker.replicas.close()
        broker.logs.close()
        broker.release_data_dir()


def _stored(broker, topic: str) -> bytes:
    log = broker.logs.get_log(topic, 0)
    return bytes(log.read(0, 1 << 22, max_offset=log.log_end_offset).records)


def _calls_on_the_loop_thread(monkeypatch, owner, name: str) -> list[bool]:
    """Wraps `owner.name`: for each call, whether it ran on the event loop's thread
    (`asyncio.run`'s, the main thread)."""
    calls, original = [], getattr(owner, name)

    def observed(*args):
        calls.append(threading.current_thread() is threading.main_thread())
        return original(*args)

    monkeypatch.setattr(owner, name, observed)
    return calls


def _answer(response):
    (topic,) = response.responses
    (partition,) = topic.partition_responses
    return partition.error_code.name, partition.base_offset


def test_another_client_is_answered_while_a_bomb_inflates(tmp_path, monkeypatch):
    bomb = with_header(build_batch([Record(b"k", b"v", (), 1_000)]), body=_gzip_bomb(64 << 20),
                       attributes=compression.GZIP)
    events: list[str] = []
    bystander_answered = threading.Event()

    async def scenario():
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()
        inflating = asyncio.Event()
        inflate = validator.decompress_bounded

        def observed(codec, data, limit):
            # The bomb inflating up to its whole bound: the other client comes now; off the
            # loop the inflation waits for its answer (on the loop, nothing else can run).
            if limit != inflate_limit(MAX_MESSAGE_BYTES):
                return inflate(codec, data, limit)
            events.append("bomb inflating")
            loop.call_soon_threadsafe(inflating.set)
            if threading.get_ident() != loop_thread:
                bystander_answered.wait(60)
            try:
                return inflate(codec, data, limit)
            finally:
                events.append("bomb inflated")

        monkeypatch.setattr(validator, "decompress_bounded", observed)

        async def bystander():
            await inflating.wait()
            request = _request("other", build_batch([Record(b"k", b"v", (), 1_000)]))
            answer = _answer(await produce.handle(_context(broker, request), request.body))
            events.append("other client answered")
            bystander_answered.set()
            return answer

        with _broker(tmp_path, {"message.max.bytes": MAX_MESSAGE_BYTES}) as broker:
            broker.create_topic("bombed", 1, {})
            broker.create_topic("other", 1, {})
            request = _request("bombed", bomb)
            other = asyncio.ensure_future(bystander())
            bombed = _answer(await produce.handle(_context(broker, request), request.body))
            return bombed, await other, broker.logs.get_log("bombed", 0).log_end_offset

    bombed, other, bombed_end = asyncio.run(scenario())
    assert bombed == ("message_too_large", -1)
    assert bombed_end == 0
    assert other == ("none", 0)
    assert events == ["bomb inflating", "other client answered", "bomb inflated"]


def test_a_batch_recompressed_off_the_loop_is_appended_as_inline_and_its_retry_is_a_duplicate(tmp_path, monkeypatch):
    """2,000 records (recompressing 10,000 took 90-180 ms) to a gzip topic from an idempotent
    producer: rebuilt in the worker thread, appended recompressed with every record, and the
    producer's retry of the same batch answered as a duplicate with the same offset."""
    records = [Record(f"k{i}".encode(), f"v{i}".encode() * 10, (), 1_000 + i) for i in range(2_000)]
    batch = build_batch(records, compression=compression.LZ4, producer_id=7, producer_epoch=0, base_sequence=0)
    rebuilt_on = _calls_on_the_loop_thread(monkeypatch, append_settings, "rebuild_batch")

    async def scenario():
        with _broker(tmp_path) as broker:
            broker.create_topic("t", 1, {"compression.type": "gzip"})
            answers = []
            for _ in range(2):
                request = _request("t", batch)
                answers.append(_answer(await produce.handle(_context(broker, request), request.body)))
            return answers, _stored(broker, "t")

    answers, stored = asyncio.run(scenario())
    assert answers == [("none", 0), ("none", 0)]
    header = read_header(stored)
    assert header.size == len(stored)  # one batch: the retry appended nothing
    assert header.compression == compression.GZIP
    assert [(r.key, r.value, r.timestamp) for r in decode_batch(stored, header)] == \
        [(r.key, r.value, r.timestamp) for r in records]
    assert rebuilt_on == [False, False]  # the retry is checked again before it is found a duplicate, as in Kafka


def test_a_compressed_v1_message_set_is_up_converted_off_the_loop(tmp_path, monkeypatch):
    """Produce v2 carries message format v1; a compressed wrapper may inflate to the bound too."""
    schema = request_schema(0, 2)
    message_set = _legacy_set(1, compression.GZIP)
    converted_on = _calls_on_the_loop_thread(monkeypatch, produce, "up_convert")

    async def scenario():
        with _broker(tmp_path) as broker:
            broker.create_topic("t", 1, {})
            request = decode_request(encode_request(make(schema, acks=1, timeout=timedelta(seconds=30), topic_data=(
                make(nested(schema, "TopicProduceData"), name="t", partition_data=(
                    make(nested(schema, "PartitionProduceData"), index=0, records=message_set),)),)))[4:],
                {0: (0, 13)})
            answer = _answer(await produce.handle(RequestContext(broker, 0, 2, request.header, "c", "127.0.0.1"),
                                                  request.body))
            return answer, _stored(broker, "t")

    answer, stored = asyncio.run(scenario())
    assert answer == ("none", 0)
    assert [r.value for r in decode_batch(stored, read_header(stored))] == [f"v{i}".encode() for i in range(5)]
    assert converted_on == [False]
