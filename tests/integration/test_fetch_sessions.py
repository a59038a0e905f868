"""Incremental fetch sessions (KIP-227) against a real `ottla serve`: raw Fetch v12/v13 frames
for the semantics and every session error, and kafka-python, which fetches with sessions."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from tests.wire import roundtrip

TOPIC = "sessions"


def _fetch12(sock, partitions, *, session_id, epoch, forget=(), max_wait_ms=0, replica_id=-1):
    """`partitions`: [(partition, fetch offset)] of TOPIC; `forget`: partitions of TOPIC."""
    request = fetch12.FetchRequest(
        cluster_id=None, replica_id=replica_id, max_wait=timedelta(milliseconds=max_wait_ms), min_bytes=1,
        max_bytes=50 << 20, isolation_level=0, session_id=session_id, session_epoch=epoch,
        topics=(fetch12.FetchTopic(topic=TOPIC, partitions=tuple(
            fetch12.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                                   log_start_offset=-1, partition_max_bytes=1 << 20)
            for p, offset in partitions)),) if partitions else (),
        forgotten_topics_data=(fetch12.ForgottenTopic(topic=TOPIC, partitions=tuple(forget)),) if forget else (),
        rack_id="")
    return roundtrip(sock, request)[1]


def _fetch13(sock, topic_id, partitions, *, session_id, epoch, forget=()):
    request = fetch13.FetchRequest(
        max_wait=timedelta(0), min_bytes=1, session_id=session_id, session_epoch=epoch,
        topics=(fetch13.FetchTopic(topic_id=topic_id, partitions=tuple(
            fetch13.FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=1 << 20)
            for p, offset in partitions)),) if partitions else (),
        forgotten_topics_data=(fetch13.ForgottenTopic(topic_id=topic_id, partitions=tuple(forget)),) if forget else ())
    return roundtrip(sock, request)[1]


def _answered(response) -> dict[int, tuple[int, int]]:
    """{partition: (high watermark, bytes of records)} of what the response names."""
    return {p.partition_index: (p.high_watermark, len(p.records or b""))
            for topic in response.responses for p in topic.partitions}


def _produce(bootstrap, partition, count=1):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(TOPIC, value=b"v%d" % i, partition=partition)
    assert producer.flush(10) == 0


@pytest.fixture
def session_topic(ottla_broker, raw_connection):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(10)
    _produce(ottla_broker.bootstrap, 0)
    return ottla_broker, raw_connection(ottla_broker.bootstrap)


def test_incremental_fetches_name_only_what_changed(session_topic):
    broker, sock = session_topic
    full = _fetch12(sock, [(0, 0), (1, 0), (2, 0)], session_id=0, epoch=0)
    assert full.error_code == ErrorCode.none and full.session_id != 0
    session = full.session_id
    assert _answered(full)[0][0] == 1 and _answered(full)[0][1] > 0 and set(_answered(full)) == {0, 1, 2}

    # Partition 0 moved on to offset 1; nothing is new anywhere: an empty answer.
    response = _fetch12(sock, [(0, 1)], session_id=session, epoch=1)
    assert (response.error_code, response.session_id, _answered(response)) == (ErrorCode.none, session, {})

    # Partition 1, left out of the requests since the full fetch, is still read from offset 0.
    _produce(broker.bootstrap, 1, count=2)
    response = _fetch12(sock, [], session_id=session, epoch=2)
    assert set(_answered(response)) == {1} and _answered(response)[1][0] == 2 and _answered(response)[1][1] > 0
    records = response.responses[0].partitions[0].records
    assert int.from_bytes(records[:8], "big") == 0  # the batch at offset 0

    # Forget partition 2: what arrives there is no longer answered; partition 1 is at 2 now.
    response = _fetch12(sock, [(1, 2)], session_id=session, epoch=3, forget=[2])
    assert _answered(response) == {}
    _produce(broker.bootstrap, 2)
    _produce(broker.bootstrap, 0)
    response = _fetch12(sock, [], session_id=session, epoch=4)
    assert set(_answered(response)) == {0}


def test_a_long_poll_waits_on_the_partitions_the_request_left_out(session_topic):
    broker, sock = session_topic
    session = _fetch12(sock, [(0, 1), (1, 0)], session_id=0, epoch=0).session_id
    assert session != 0
    timer = threading.Timer(0.5, _produce, args=(broker.bootstrap, 1))
    timer.start()
    response = _fetch12(sock, [], session_id=session, epoch=1, max_wait_ms=30_000)
    timer.join()
    assert set(_answered(response)) == {1} and _answered(response)[1][1] > 0


def test_session_errors_on_the_wire(session_topic):
    _, sock = session_topic
    session = _fetch12(sock, [(0, 0)], session_id=0, epoch=0).session_id
    assert session != 0
    unknown = _fetch12(sock, [(0, 0)], session_id=session + 1, epoch=1)
    assert (unknown.error_code, unknown.session_id, unknown.responses) == (ErrorCode.fetch_session_id_not_found, 0, ())
    no_id = _fetch12(sock, [(0, 0)], session_id=0, epoch=1)
    assert no_id.error_code == ErrorCode.fetch_session_id_not_found
    assert _fetch12(sock, [], session_id=session, epoch=1).error_code == ErrorCode.none
    replayed = _fetch12(sock, [], session_id=session, epoch=1)  # a duplicate of the request before
    assert (replayed.error_code, replayed.responses) == (ErrorCode.invalid_fetch_session_epoch, ())
    ahead = _fetch12(sock, [], session_id=session, epoch=5)
    assert ahead.error_code == ErrorCode.invalid_fetch_session_epoch
    assert _fetch12(sock, [], session_id=session, epoch=2).error_code == ErrorCode.none  # still there
    # Epoch -1 closes it: its id is unknown afterwards.
    closing = _fetch12(sock, [(0, 0)], session_id=session, epoch=-1)
    assert closing.error_code == ErrorCode.none and closing.session_id == 0 and set(_answered(closing)) == {0}
    assert _fetch12(sock, [], session_id=session, epoch=3).error_code == ErrorCode.fetch_session_id_not_found


def _topic_id(sock) -> uuid.UUID:
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=TOPIC),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return roundtrip(sock, request)[1].topics[0].topic_id


def test_sessions_by_topic_id_and_by_name_do_not_mix(session_topic):
    broker, sock = session_topic
    topic_id = _topic_id(sock)
    by_id = _fetch13(sock, topic_id, [(0, 0), (1, 0)], session_id=0, epoch=0)
    assert by_id.session_id != 0 and by_id.responses[0].topic_id == topic_id
    by_name = _fetch12(sock, [(0, 0)], session_id=0, epoch=0).session_id
    assert by_name != 0
    assert _fetch12(sock, [], session_id=by_id.session_id, epoch=1).error_code == ErrorCode.fetch_session_topic_id_error
    by_name_by_id = _fetch13(sock, topic_id, [], session_id=by_name, epoch=1)
    assert by_name_by_id.error_code == ErrorCode.fetch_session_topic_id_error
    # By id, the session works as by name: forget partition 0, then only partition 1 is read.
    response = _fetch13(sock, topic_id, [], session_id=by_id.session_id, epoch=1, forget=[0])
    assert response.error_code == ErrorCode.none and response.responses == ()
    _produce(broker.bootstrap, 0)
    _produce(broker.bootstrap, 1)
    response = _fetch13(sock, topic_id, [], session_id=by_id.session_id, epoch=2)
    assert [(t.topic_id, [p.partition_index for p in t.partitions]) for t in response.responses] == [(topic_id, [1])]


def test_the_cache_holds_max_incremental_fetch_session_cache_slots(ottla_broker_factory, raw_connection):
    broker = ottla_broker_factory({"max.incremental.fetch.session.cache.slots": "1"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    sock = raw_connection(broker.bootstrap)
    first = _fetch12(sock, [(0, 0)], session_id=0, epoch=0)
    assert first.session_id != 0
    # The one slot is taken by a session too young to evict: no session, a full answer.
    second = _fetch12(sock, [(0, 0)], session_id=0, epoch=0)
    assert (second.error_code, second.session_id, set(_answered(second))) == (ErrorCode.none, 0, {0})
    assert _fetch12(sock, [], session_id=first.session_id, epoch=1).error_code == ErrorCode.none


def test_kafka_python_consumes_through_an_incremental_session(session_topic):
    """kafka-python (3.x) opens a session per broker and then sends incremental fetches; every
    record arrives once, also those produced later to partitions its requests left out."""
    from kafka import KafkaConsumer, TopicPartition

    broker, _ = session_topic
    _produce(broker.bootstrap, 1, count=10)
    _produce(broker.bootstrap, 2, count=10)
    partitions = [TopicPartition(TOPIC, p) for p in range(3)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}

        def consume_until(total):
            for _ in range(600):
                for tp, records in consumer.poll(timeout_ms=100).items():
                    seen[tp.partition].extend(r.offset for r in records)
                if sum(map(len, seen.values())) >= total:
                    return

        consume_until(21)
        handlers = consumer._fetcher._session_handlers
        (handler,) = handlers.values()
        session = handler.next_metadata.session_id
        assert session != 0  # the broker created a session
        for round, partition in enumerate([0, 1, 2, 0]):  # each round: new records in one partition
            _produce(broker.bootstrap, partition)
            consume_until(22 + round)
        assert seen == {0: list(range(3)), 1: list(range(11)), 2: list(range(11))}
        # The same session carried every round: its requests were incremental, epochs on.
        assert handler.next_metadata.session_id == session and handler.next_metadata.epoch >= 4
    finally:
        consumer.close()
