"""kill -9 the broker mid-stream: every acknowledged record survives, offsets stay dense."""

import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "crashy"
PARTITIONS = 3


def _read_partition(bootstrap, partition, timeout=60, topic=TOPIC):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    records = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                break
            raise AssertionError(message.error())
        records.append((message.offset(), message.value()))
    consumer.close()
    return records


def test_acknowledged_records_survive_kill_9(ottla_broker_factory):
    broker = ottla_broker_factory({"log.segment.bytes": 256 * 1024})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2,
                         "message.timeout.ms": 120000, "retry.backoff.ms": 100,
                         "reconnect.backoff.max.ms": 500})
    acked = {}
    stop = threading.Event()

    def delivered(err, msg):
        if err is None:
            acked[msg.value()] = (msg.partition(), msg.offset())

    def produce():
        i = 0
        while not stop.is_set():
            try:
                producer.produce(TOPIC, value=f"record-{i:08d}".encode(), partition=i % PARTITIONS,
                                 on_delivery=delivered)
                i += 1
            except BufferError:
                producer.poll(0.05)
            if i % 500 == 0:
                producer.poll(0)
        producer.flush(120)

    thread = threading.Thread(target=produce)
    thread.start()
    while len(acked) < 20_000:
        time.sleep(0.05)
    broker.kill()
    acked_at_crash = dict(acked)
    broker.start()
    time.sleep(1.0)
    stop.set()
    thread.join(180)

    assert len(acked_at_crash) >= 20_000
    for partition in range(PARTITIONS):
        records = _read_partition(broker.bootstrap, partition)
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(offsets))), "offsets must be dense"
        stored = {offset: value for offset, value in records}
        for value, (p, offset) in acked.items():
            if p == partition:
                assert stored.get(offset) == value, f"acknowledged {value!r} lost at {partition}/{offset}"


def test_torn_last_batch_is_cut_on_restart(ottla_broker_factory):
    broker = ottla_broker_factory()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce(TOPIC, value=f"r{i}".encode(), partition=0)
        producer.flush(10)  # one batch per record
    broker.kill()
    segment = sorted(Path(broker.data_dir, f"{TOPIC}-0").glob("*.log"))[-1]
    size = segment.stat().st_size
    with open(segment, "r+b") as handle:
        handle.truncate(size - 5)  # a torn write of the last batch
    indexes = [segment.with_suffix(".index"), segment.with_suffix(".timeindex")]
    assert [p.stat().st_size for p in indexes] == [0, 0]  # no entry (10 small batches): never preallocated
    broker.start()
    assert [p.stat().st_size for p in indexes] == [0, 0]
    records = _read_partition(broker.bootstrap, 0)
    assert [value for _, value in records] == [f"r{i}".encode() for i in range(9)]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    offsets = []
    producer.produce(TOPIC, value=b"after", partition=0, on_delivery=lambda e, m: offsets.append(m.offset()))
    producer.flush(10)
    assert offsets == [9]
    assert [value for _, value in _read_partition(broker.bootstrap, 0)][-1] == b"after"


def _recovery_point(data_dir, topic, partition):
    path = Path(data_dir, "recovery-point-offset-checkpoint")  # replaced atomically, as Kafka's
    for line in (path.read_text().splitlines()[2:] if path.exists() else []):
        name, index, offset = line.split()
        if (name, int(index)) == (topic, partition):
            return int(offset)
    return None


def test_recovery_rescans_only_from_the_checkpointed_recovery_point(ottla_broker_factory):
    """Segments rolled (and fsynced) before the crash are below the recovery point the broker
    checkpointed: after kill -9 only the active segment is rescanned, every record below the
    recovery point is served as it was, and a torn batch in the active segment is still cut."""
    broker = ottla_broker_factory({"log.segment.bytes": 4096, "log.flush.offset.checkpoint.interval.ms": 100},
                                  log_level="info")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    values = [f"r{i:03d}-".encode() + b"x" * 300 for i in range(60)]
    acked = []
    for value in values:
        producer.produce(TOPIC, value=value, partition=0, on_delivery=lambda e, m: acked.append(m.offset()))
        producer.flush(10)  # one batch per record
    assert acked == list(range(60))
    directory = Path(broker.data_dir, f"{TOPIC}-0")
    active = max(int(p.name[:-4]) for p in directory.glob("*.log"))
    assert active > 0
    deadline = time.monotonic() + 60
    while _recovery_point(broker.data_dir, TOPIC, 0) != active:  # the rolls' fsyncs, checkpointed
        assert time.monotonic() < deadline, "the recovery point never reached the active segment"
        time.sleep(0.1)
    broker.kill()
    segment = directory / f"{active:020d}.log"
    torn_size = segment.stat().st_size - 5
    with open(segment, "r+b") as handle:
        handle.truncate(torn_size)  # a torn write of the last batch, past the recovery point
    logged = len(broker.read_stderr())
    broker.start()
    recovered = [line for line in broker.read_stderr()[logged:].splitlines() if f"recovered log {TOPIC}-0:" in line]
    assert len(recovered) == 1 and f"scanned {torn_size} bytes in 1 segments" in recovered[0], recovered
    records = _read_partition(broker.bootstrap, 0)
    assert [offset for offset, _ in records] == list(range(59))
    assert [value for _, value in records] == values[:59]  # below the recovery point and after it
    offsets = []
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(TOPIC, value=b"after", partition=0, on_delivery=lambda e, m: offsets.append(m.offset()))
    producer.flush(10)
    assert offsets == [59]


def test_kill_9_after_a_clean_restart_keeps_every_acknowledged_record_once(ottla_broker_factory):
    """The usual crash of a long-running broker: it had restarted cleanly (recovery points and
    producer snapshots at that restart's log ends, inside every active segment), took more
    acknowledged writes from an idempotent producer, and was killed with kill -9. Recovery then
    rebuilds indexes the crash left preallocated and keeps the snapshots still valid: every
    acknowledged record is there once, at its acknowledged offset, reads through the rebuilt
    indexes find them, and the same producer's next records continue its sequence."""
    topic, partitions = "restarted", 4
    broker = ottla_broker_factory({"log.index.interval.bytes": 256})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 1,
                         "message.timeout.ms": 120000, "reconnect.backoff.max.ms": 500})
    acked = {}
    errors = []

    def delivered(err, msg):
        if err is None:
            acked[msg.value()] = (msg.partition(), msg.offset())
        else:
            errors.append(err)

    def produce_round(n):
        for i in range(300):
            producer.produce(topic, value=f"round{n}-{i:04d}-".encode() + b"x" * 100, partition=i % partitions,
                             on_delivery=delivered)
            if i % 20 == 19:
                assert producer.flush(120) == 0  # many batches: the indexes get entries
        assert producer.flush(120) == 0

    produce_round(0)
    broker.stop()
    broker.start()
    produce_round(1)
    broker.kill()
    active = Path(broker.data_dir, f"{topic}-0", f"{0:020d}.index")
    assert active.stat().st_size == 10485760  # the crash left it preallocated: recovery rebuilds it
    broker.start()
    produce_round(2)
    assert errors == [] and len(acked) == 900
    stored = {p: _read_partition(broker.bootstrap, p, topic=topic) for p in range(partitions)}
    for partition, records in stored.items():
        assert [offset for offset, _ in records] == list(range(len(records))), "offsets must be dense"
        assert len(records) == 225  # every acknowledged record once, nothing else
    for value, (partition, offset) in acked.items():
        assert stored[partition][offset] == (offset, value), f"acknowledged {value!r} not at {partition}/{offset}"


def test_a_topic_created_again_keeps_its_first_records_through_a_kill_9(ottla_broker_factory):
    """The old topic's log start offset stayed in log-start-offset-checkpoint until the next
    periodic write; a kill -9 before it hid the new topic's first records behind it."""
    broker = ottla_broker_factory({"log.flush.offset.checkpoint.interval.ms": 3_600_000})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = "again"

    def create_and_fill(prefix: bytes) -> None:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for i in range(100):
            producer.produce(topic, value=b"%s-%03d" % (prefix, i), partition=0)
        assert producer.flush(30) == 0

    create_and_fill(b"old")
    tp = TopicPartition(topic, 0, 60)
    assert admin.delete_records([tp])[tp].result(30).low_watermark == 60
    broker.restart()  # a clean shutdown checkpoints the log start offset, 60
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    create_and_fill(b"new")
    broker.restart(crash=True)
    assert _read_partition(broker.bootstrap, 0, topic=topic) == [(i, b"new-%03d" % i) for i in range(100)]
