"""Real clients (confluent-kafka and kafka-python) against a real broker process."""

import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KPTopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from tests.pagecache import resident_bytes
from tests.waiting import wait_for

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _create(bootstrap, name, partitions, config=None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(15)
    return admin


def _consume_all(bootstrap, topic, partitions, expected, isolation="read_uncommitted"):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + 90
    while len(got) < expected and time.monotonic() < deadline:
        for message in consumer.consume(1000, 1.0):
            assert message.error() is None, message.error()
            got.append(message)
    consumer.close()
    return got


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_roundtrip_with_keys_headers_and_compression(ottla_broker, codec):
    topic, partitions, count = f"rt-{codec}", 4, 20_000
    _create(ottla_broker.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap, "compression.type": codec,
                         "linger.ms": 5, "acks": "all"})
    sent = defaultdict(list)
    errors = []

    def delivered(err, msg):
        if err:
            errors.append(err)
        else:
            # delivery reports do not carry headers: rebuild the ones this value was sent with
            headers = [("seq", msg.value().split(b"-")[1]), ("codec", codec.encode())]
            sent[msg.partition()].append((msg.offset(), msg.key(), msg.value(), headers))

    for i in range(count):
        producer.produce(topic, key=f"k{i % 101}".encode(), value=f"value-{i}-".encode() * (1 + i % 5),
                         headers=[("seq", str(i).encode()), ("codec", codec.encode())], on_delivery=delivered)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors
    received = defaultdict(list)
    for message in _consume_all(ottla_broker.bootstrap, topic, partitions, count):
        received[message.partition()].append((message.offset(), message.key(), message.value(), message.headers()))
    assert sum(map(len, received.values())) == count
    for partition in range(partitions):
        assert received[partition] == sent[partition]
        offsets = [r[0] for r in received[partition]]
        assert offsets == list(range(len(offsets)))  # dense, in order


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_roundtrip(ottla_broker, codec):
    topic, count = f"kp-{codec}", 5_000
    _create(ottla_broker.bootstrap, topic, 3)
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap, acks="all",
                             compression_type=None if codec == "none" else codec, linger_ms=5)
    futures = [producer.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode(),
                             headers=[("i", str(i).encode())]) for i in range(count)]
    producer.flush(60)
    sent = defaultdict(list)
    for i, future in enumerate(futures):
        metadata = future.get(30)
        sent[metadata.partition].append((metadata.offset, f"v{i}".encode()))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=ottla_broker.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    consumer.assign([KPTopicPartition(topic, p) for p in range(3)])
    consumer.seek_to_beginning()
    received = defaultdict(list)
    for message in consumer:
        received[message.partition].append((message.offset, message.value))
        assert dict(message.headers)["i"] == message.value[1:]
        if sum(map(len, received.values())) == count:
            break
    consumer.close()
    assert {p: sorted(v) for p, v in sent.items()} == dict(received)


def test_list_offsets_by_timestamp_and_describe_and_delete(ottla_broker):
    topic = "timed"
    admin = _create(ottla_broker.bootstrap, topic, 1, {"retention.ms": "3600000", "segment.bytes": "1048576"})
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap})
    base = 1_700_000_000_000
    for i in range(100):
        producer.produce(topic, value=b"x", timestamp=base + i * 1000)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": ottla_broker.bootstrap, "group.id": "unused"})
    found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 42_500)], 10)
    assert found[0].offset == 43
    found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 10_000_000)], 10)
    assert found[0].offset == -1  # no record that late: Kafka answers -1
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 100)
    consumer.close()

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "3600000"
    assert configs["segment.bytes"].value == "1048576"
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].is_default

    admin.delete_topics([topic])[topic].result(10)
    assert topic not in admin.list_topics(timeout=10).topics
    # The partition directories go at once (renamed `<name>.<id>-delete`, as Kafka does), and
    # the renamed ones soon after, in the disk worker.
    leftovers = lambda: [p.name for p in ottla_broker.data_dir.iterdir() if p.name.startswith(f"{topic}-")]  # noqa: E731
    assert all(name.endswith("-delete") for name in leftovers())
    wait_for(lambda: not leftovers(), what="the deleted partitions' directories to be removed")


def test_alter_configs_both_forms_answer_each_resource(ottla_broker):
    """kafka-python's legacy AlterConfigs and confluent-kafka's IncrementalAlterConfigs: a bad
    value fails its own resource only, and the good one is applied and described."""
    admin = _create(ottla_broker.bootstrap, "cfg-a", 1, {"retention.ms": "1000"})
    _create(ottla_broker.bootstrap, "cfg-b", 1)
    legacy = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    try:
        answers = legacy.alter_configs(
            [KPConfigResource(ConfigResourceType.TOPIC, "cfg-a", configs={"segment.bytes": "1048576"}),
             KPConfigResource(ConfigResourceType.TOPIC, "cfg-b", configs={"retention.ms": "soon"})],
            incremental=False, raise_on_unknown=False)
    finally:
        legacy.close()
    assert answers["topic"]["cfg-a"] == "OK"
    assert "InvalidConfigurationError" in str(answers["topic"]["cfg-b"])

    good = ConfigResource(ConfigResource.Type.TOPIC, "cfg-a", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    bad = ConfigResource(ConfigResource.Type.TOPIC, "cfg-b", incremental_configs=[
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)])
    futures = admin.incremental_alter_configs([good, bad])
    futures[good].result(10)
    with pytest.raises(KafkaException) as refused:
        futures[bad].result(10)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG

    configs = admin.describe_configs([good])[good].result(10)
    assert configs["segment.bytes"].value == "1048576" and not configs["segment.bytes"].is_default
    assert configs["retention.ms"].is_default
    configs = admin.describe_configs([bad])[bad].result(10)
    assert configs["retention.ms"].is_default


def test_create_times_out_of_bounds_are_invalid_timestamp(ottla_broker):
    """message.timestamp.after.max.ms (default one hour) and before.max.ms (set per topic)
    reach the producer as INVALID_TIMESTAMP, and nothing of the refused record is stored."""
    topic = "stamps"
    admin = _create(ottla_broker.bootstrap, topic, 1, {"message.timestamp.before.max.ms": "86400000"})
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap, "acks": "all", "retries": 0})
    outcomes = []
    now = int(time.time() * 1000)
    for stamp in (now, now + 2 * 3_600_000, now - 2 * 86_400_000, now + 60_000):
        producer.produce(topic, value=str(stamp).encode(), timestamp=stamp,
                         on_delivery=lambda err, msg: outcomes.append(err.code() if err else msg.offset()))
        producer.flush(30)
    assert outcomes == [0, KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_TIMESTAMP, 1]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["message.timestamp.after.max.ms"].value == "3600000"
    assert configs["message.timestamp.before.max.ms"].value == "86400000"


def test_create_topic_errors(ottla_broker):
    from kio.schema.errors import ErrorCode
    admin = _create(ottla_broker.bootstrap, "exists", 1)
    cases = {
        "exists": (NewTopic("exists", 1, 1), ErrorCode.topic_already_exists),
        "bad name": (NewTopic("bad/name", 1, 1), ErrorCode.invalid_topic_exception),
        "replication 3": (NewTopic("rf3", 1, 3), ErrorCode.invalid_replication_factor),
        "bad config": (NewTopic("badcfg", 1, 1, config={"cleanup.policy": "shred"}), ErrorCode.invalid_config),
    }
    for label, (new_topic, code) in cases.items():
        with pytest.raises(Exception) as info:
            admin.create_topics([new_topic])[new_topic.topic].result(10)
        assert info.value.args[0].code() == code.value, label
    listed = admin.list_topics(timeout=10).topics
    assert {name for name in listed if not name.startswith("__")} == {"exists"}


def test_records_past_the_page_cache_budget_come_back_from_the_files(ottla_broker_factory):
    """With a 2 MiB page-cache budget, 12 MB produced with confluent-kafka leave the cache as
    newer records arrive, and kafka-python reads every record back, byte-exact, from disk.

    A chunk leaves the cache once it is written back, in a thread of the broker's (on a busy disk
    after the last acknowledgement): waited for, not checked at once."""
    broker = ottla_broker_factory({"log.page.cache.max.bytes": 2 << 20})
    _create(broker.bootstrap, "aged", 1)
    count = 12_000

    def value(i: int) -> bytes:
        return i.to_bytes(4, "big") * 250

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce("aged", key=str(i).encode(), value=value(i))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    segment = broker.data_dir / "aged-0" / f"{0:020d}.log"
    size = segment.stat().st_size
    assert size > count * 1000
    wait_for(lambda: resident_bytes(segment) < size // 2, timeout=60,
             what="the records past the budget to leave the page cache")

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([KPTopicPartition("aged", 0)])
    got = [(m.offset, m.key, m.value) for m in consumer]
    consumer.close()
    assert got == [(i, str(i).encode(), value(i)) for i in range(count)]
