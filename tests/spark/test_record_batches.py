"""The sink's batch encoder and own producer (issue 16): what it encodes is what the rows hold, the broker's
record validator accepts it, its partitioner is Java's, and real clients (confluent-kafka, kafka-python) read
back exactly the rows written: null keys and values, headers with null values, string and binary columns."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.partitioner.default import murmur2

from ottla.records.batch import parse_batches, validate_client_batch
from ottla.records.records import decode_batch
from ottla.records.validator import check_records
from ottla.spark import compiled, record_batches
from ottla.spark.producer import OwnProducer
from ottla.spark.record_batches import Columns, encode_batches, encode_sets, murmur2_partitions

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

data = st.binary(max_size=300)
# No NUL in header keys: confluent-kafka hands them to Python as C strings, cut at the first NUL.
header = st.tuples(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8), st.none() | st.binary(max_size=20))
row = st.tuples(st.none() | data, st.none() | data, st.none() | st.lists(header, max_size=3))


def columns(rows: list, *, with_headers: bool = True) -> Columns:
    headers = pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for _, _, h in rows], HEADERS)
    return Columns(pa.array([v for _, v, _ in rows], pa.binary()), pa.array([k for k, _, _ in rows], pa.binary()),
                   headers if with_headers else None)


def expected(rows: list, with_headers: bool = True) -> list:
    return [(k, v, tuple(h or ()) if with_headers else ()) for k, v, h in rows]


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=40), max_bytes=st.sampled_from([300, 1_000_000]),
       sequence=st.sampled_from([-1, 0, 7, 2**31 - 3]), with_headers=st.booleans())
def test_batches_hold_the_rows_and_pass_the_brokers_validation(rows, max_bytes, sequence, with_headers):
    batches = encode_batches(columns(rows, with_headers=with_headers), max_bytes=max_bytes, sequence=sequence,
                             timestamp=1_700_000_000_000, producer_id=5 if sequence >= 0 else -1,
                             producer_epoch=3 if sequence >= 0 else -1, transactional=False)
    decoded, next_sequence = [], sequence
    for batch in batches:
        (head,) = parse_batches(batch.data)  # one whole batch, its CRC right
        validate_client_batch(head)
        check_records(batch.data, head, 1 << 20)
        assert head.records_count == batch.records
        assert len(batch.data) <= max_bytes or batch.records == 1  # a record over the limit goes alone
        assert head.base_sequence == next_sequence
        if sequence >= 0:
            next_sequence = (next_sequence + batch.records) % 2**31
        records = decode_batch(batch.data)
        assert [r.timestamp for r in records] == [1_700_000_000_000] * len(records)
        decoded += [(r.key, r.value, r.headers) for r in records]
    assert decoded == expected(rows, with_headers)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4),
       max_bytes=st.sampled_from([300, 1_000_000]), with_headers=st.booleans(), short_keys=st.booleans())
def test_sets_of_rows_encoded_at_once_are_each_partitions_batches(rows, cuts, max_bytes, with_headers, short_keys):
    """A producer encodes each partition's rows (a set) in one call: every set's batches hold its rows, offset
    deltas from 0 in each batch, sequence numbers following on from the set's own."""
    if short_keys:  # keys a head holds (the others are joined as pieces of their own)
        rows = [(None if k is None else k[:8], v, h) for k, v, h in rows]
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    sets = [(start, stop, 100 * i) for i, (start, stop) in enumerate(zip(bounds, bounds[1:]))]
    encoded = encode_sets(columns(rows, with_headers=with_headers), sets, max_bytes=max_bytes, timestamp=5,
                          producer_id=5, producer_epoch=3, transactional=True)
    assert len(encoded) == len(sets)
    for (start, stop, sequence), batches in zip(sets, encoded):
        decoded, next_sequence = [], sequence
        for batch in batches:
            (head,) = parse_batches(batch.data)
            validate_client_batch(head)
            check_records(batch.data, head, 1 << 20)
            assert (head.base_sequence, head.records_count, head.is_transactional) == (next_sequence, batch.records,
                                                                                      True)
            next_sequence += batch.records
            decoded += [(r.key, r.value, r.headers) for r in decode_batch(batch.data)]
        assert decoded == expected(rows[start:stop], with_headers)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.none() | st.text(max_size=10), min_size=1, max_size=20))
def test_string_keys_are_written_as_their_utf8_bytes(keys):
    (batch,) = encode_batches(Columns(pa.array([b"v"] * len(keys)), pa.array(keys, pa.string())), max_bytes=1 << 30,
                              timestamp=0)
    assert [r.key for r in decode_batch(batch.data)] == [None if k is None else k.encode() for k in keys]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=20), with_headers=st.booleans(), large_keys=st.booleans())
def test_large_binary_and_string_columns_are_written_as_their_bytes(rows, with_headers, large_keys):
    """Spark sends large_binary and large_string columns with spark.sql.execution.arrow.useLargeVarTypes: the
    join refused to mix them with the encoder's binary pieces (ArrowNotImplementedError)."""
    plain = columns(rows)
    keys = pa.array([None if k is None else k.decode("latin-1") for k, _, _ in rows], pa.large_string())
    headers = plain.headers.cast(pa.list_(pa.struct([("key", pa.large_string()), ("value", pa.large_binary())])))
    large = Columns(plain.values.cast(pa.large_binary()), keys if large_keys else plain.keys,
                    headers if with_headers else None)
    (batch,) = encode_batches(large, max_bytes=1 << 30, timestamp=0)
    decoded = [(r.key, r.value, r.headers) for r in decode_batch(batch.data)]
    latin = [(None if k is None else k.decode("latin-1").encode(), v, h) if large_keys else (k, v, h)
             for k, v, h in rows]
    assert decoded == expected(latin, with_headers)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.none() | st.binary(max_size=24), min_size=1, max_size=50), partitions=st.integers(1, 50))
def test_keys_go_where_javas_partitioner_puts_them(keys, partitions):
    got = murmur2_partitions(pa.array(keys, pa.binary()), partitions).tolist()
    assert got == [-1 if k is None else (murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"own-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the topic exists: it serves the future
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _read_confluent(bootstrap: str, topic: str, partitions: int) -> dict:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, ended = {p: [] for p in range(partitions)}, set()
    try:
        while len(ended) < partitions:
            message = consumer.poll(10)
            assert message is not None, "no end of partition seen"
            if message.error():
                ended.add(message.partition())
                continue
            got[message.partition()].append((message.key(), message.value(), tuple(message.headers() or ())))
    finally:
        consumer.close()
    return got


def _read_kafka_python(bootstrap: str, topic: str, partitions: int, counts: dict) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([KafkaPythonTopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    got = {p: [] for p in range(partitions)}
    try:
        for message in consumer:
            got[message.partition].append((message.key, message.value, tuple(message.headers)))
            if all(len(got[p]) >= counts[p] for p in got):
                break
    finally:
        consumer.close()
    return got


@pytest.fixture(scope="module")
def broker():
    import ottla.testing

    with ottla.testing.broker() as started:
        yield started


@pytest.fixture(params=["numpy", "numba"])
def encoder(request, monkeypatch):
    """The own producer's encoder: numpy's (a fresh worker's) or numba's (kernels.py: a warm worker's)."""
    monkeypatch.setattr(compiled, "COMPILED_AFTER_SECONDS", 0 if request.param == "numba" else float("inf"))
    if request.param == "numba":
        compiled.load()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row, min_size=1, max_size=30), partitions=st.integers(1, 3), explicit=st.booleans(),
       sends=st.integers(1, 3))
def test_real_clients_read_back_what_the_own_producer_wrote(broker, encoder, rows, partitions, explicit, sends):
    rows = rows + [(b"k" * 70, b"v" * 200, [("h" * 70, b"w" * 70)])]  # varints of two bytes in every example
    topic = _topic(broker.bootstrap, partitions)
    producer = OwnProducer({"bootstrap.servers": broker.bootstrap}, 30)
    try:
        wanted = {p: [] for p in range(partitions)}
        chosen = [i % partitions if explicit else -1 for i in range(len(rows))]
        for _ in range(sends):  # the same rows again: sequence numbers go on from the last batch's
            placed = producer.send(topic, columns(rows), pa.array(chosen, pa.int64()).to_numpy())
            for (key, value, headers), partition in zip(rows, placed):
                wanted[int(partition)].append((key, value, tuple(headers or ())))
        producer.flush()
    finally:
        producer.close()
    for partition, written in wanted.items():
        keyed = [k for k, _, _ in written if k is not None]
        assert all((murmur2(k) & 0x7FFFFFFF) % partitions == partition for k in keyed) or explicit
    assert _read_confluent(broker.bootstrap, topic, partitions) == wanted
    assert _read_kafka_python(broker.bootstrap, topic, partitions, {p: len(w) for p, w in wanted.items()}) == wanted


@pytest.mark.timeout(300)
def test_the_own_producer_carries_on_after_the_broker_restarted(ottla_broker):
    """A kept producer's connection dies with the broker (kill -9): the next rows are resent over a new one, in
    order, with the sequence numbers the restarted broker expects."""
    topic = _topic(ottla_broker.bootstrap, 2)
    producer = OwnProducer({"bootstrap.servers": ottla_broker.bootstrap}, 60)
    try:
        first = [(f"k{i}".encode(), f"a{i}".encode(), None) for i in range(50)]
        producer.send(topic, columns(first), np.arange(50) % 2)
        producer.flush()
        ottla_broker.restart(crash=True)
        then = [(f"k{i}".encode(), f"b{i}".encode(), None) for i in range(50)]
        producer.send(topic, columns(then), np.arange(50) % 2)
        producer.flush()
    finally:
        producer.close()
    got = _read_confluent(ottla_broker.bootstrap, topic, 2)
    assert got == {p: [(k, v, ()) for i, (k, v, _) in enumerate(first + then) if i % 2 == p] for p in (0, 1)}


def test_a_partitions_rows_over_one_batch_go_in_separate_requests(broker):
    """3,000 rows of 1 KiB to one partition are four batches of at most 1 MB; a Produce request holding all
    four kept only the last (the broker keeps one entry per partition, as Kafka's does), which a new producer id
    was refused for: UNKNOWN_PRODUCER_ID, its batch starting at sequence 2,839."""
    topic = _topic(broker.bootstrap, 2)
    rows = [(str(i).encode(), str(i).encode().rjust(1024, b"x"), None) for i in range(3000)]
    producer = OwnProducer({"bootstrap.servers": broker.bootstrap}, 30)
    try:
        producer.send(topic, columns(rows), np.zeros(len(rows), np.int64))
        producer.flush()
    finally:
        producer.close()
    assert _read_confluent(broker.bootstrap, topic, 2) == {0: [(k, v, ()) for k, v, _ in rows], 1: []}


@pytest.mark.timeout(300)
def test_up_to_five_requests_per_leader_are_in_flight_and_a_crash_loses_or_repeats_none(ottla_broker):
    """The producer sends the next Produce request without waiting for the answers to the last four (Kafka's
    limit for an idempotent producer). The broker is killed (-9) with five requests in flight, some written and
    some not: after its restart the producer resends them in order and every row is read back once, in order
    (the ones written before the crash are answered DUPLICATE_SEQUENCE_NUMBER)."""
    topic = _topic(ottla_broker.bootstrap, 1)
    producer = OwnProducer({"bootstrap.servers": ottla_broker.bootstrap}, 60)
    sent = []
    try:
        for send in range(7):
            rows = [(None, f"{send}-{i}".encode(), None) for i in range(200)]
            producer.send(topic, columns(rows), np.zeros(len(rows), np.int64))
            sent += rows
        assert [len(queue) for queue in producer._in_flight.values() if queue] == [5]
        ottla_broker.restart(crash=True)
        producer.flush()
    finally:
        producer.close()
    assert _read_confluent(ottla_broker.bootstrap, topic, 1) == {0: [(k, v, ()) for k, v, _ in sent]}
