"""Replication on a real ZooKeeper and three real `ottla serve` processes, with real clients.

Replication factor 3 with min.insync.replicas=2: an idempotent acks=all producer goes on
through a kill -9 of the leader, every acknowledged record is on the new leader exactly once
and in order, and once the old leader is back and caught up the three logs are the same
batch by batch. A follower cut off by a TCP proxy leaves the ISR after
replica.lag.time.max.ms and rejoins once the cut ends; with both followers cut off acks=all
gets NOT_ENOUGH_REPLICAS, and records appended as the cut began, which only the leader has,
are answered NOT_ENOUGH_REPLICAS_AFTER_APPEND, never acknowledged (to either client library).

Then, on the same cluster: ten kill -9 bounces of partition leaders (the controller among
them) under steady idempotent producers of both client libraries on three partitions, with
the same checks per partition and producer; a follower whose newest segment lost its tail at
restart rejoins and is repaired from the leader; and after an unclean election, consumers of
both client libraries detect through their leader epochs (KIP-320) that records they read
are gone, instead of reading on past it.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, ElectionType
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import LogTruncationError, NotEnoughReplicasAfterAppendError, NotEnoughReplicasError

from ottla.testing import cluster
from ottla.testing.zookeeper import free_port
from tests.cluster_checks import base_offset, partition_info, segment_batches
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for

LAG_MS = 3000
CONFIG = {"replica.lag.time.max.ms": LAG_MS, "replica.fetch.backoff.ms": 200}


def create_replicated(three, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    for p in range(partitions):
        wait_for(lambda: (lambda i: i is not None and i[0] >= 0 and len(i[2]) == 3)(
            partition_info(three.bootstrap, topic, p)), what=f"{topic}-{p} led with a full ISR")


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, config=CONFIG, root=tmp_path_factory.mktemp("replication")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


class SteadyProducer:
    """An idempotent acks=all producer sending 0, 1, 2, ... and recording what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str):
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 120000, "retry.backoff.ms": 100})
        self.topic = topic
        self.acked: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg):
        if err is None:
            self.acked.append(int(msg.value()))
        else:
            self.errors.append(str(err))

    def _run(self):
        n = 0
        while not self._stop.is_set():
            if n - len(self.acked) - len(self.errors) < 100:  # a steady rate: at most 100 in flight
                self.producer.produce(self.topic, str(n).encode(), on_delivery=self._delivered)
                n += 1
            self.producer.poll(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.producer.flush(120)

    def __exit__(self, *exc):
        if not self._stop.is_set():
            self.stop()


def test_leader_kill_loses_no_acknowledged_record_and_replicas_converge(three):
    topic = "replicated"
    create_replicated(three, topic)
    with SteadyProducer(three.bootstrap, topic) as producer:
        wait_for(lambda: len(producer.acked) >= 300, what="records acknowledged")
        leader = partition_info(three.bootstrap, topic)[0]
        three.brokers[leader].kill()
        at_kill = len(producer.acked)
        survivors = ",".join(b.bootstrap for i, b in three.brokers.items() if i != leader)
        wait_for(lambda: (lambda i: i is not None and i[0] not in (-1, leader))(partition_info(survivors, topic)),
                 what="a new leader")
        wait_for(lambda: len(producer.acked) >= at_kill + 300, what="records acknowledged by the new leader")
        three.brokers[leader].start()
        wait_for(lambda: (lambda i: i is not None and len(i[2]) == 3)(partition_info(three.bootstrap, topic)),
                 what="the old leader back in the ISR")
        wait_for(lambda: len(producer.acked) >= at_kill + 600, what="records acknowledged with three in sync")
        assert producer.stop() == 0
    assert producer.errors == []

    consumer = KafkaConsumer(bootstrap_servers=three.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    high_watermark = consumer.end_offsets([tp])[tp]
    values = [int(m.value) for m in consumer]
    consumer.close()
    assert len(values) == high_watermark
    assert values == sorted(values) and len(set(values)) == len(values)  # in order, exactly once
    assert set(producer.acked) <= set(values)

    # The three logs agree batch by batch below the high watermark: every ISR member, the old
    # leader included, has everything below it.
    logs = {i: segment_batches(h.data_dir, topic, high_watermark) for i, h in three.brokers.items()}
    reference = logs[next(iter(logs))]
    assert reference and base_offset(reference[0]) == 0
    last = reference[-1]
    assert base_offset(last) + int.from_bytes(last[23:27], "big") + 1 == high_watermark
    for broker_id, batches in logs.items():
        assert batches == reference, f"broker {broker_id}'s log differs"


FETCH = 1


def test_cut_off_followers_leave_the_isr_and_rejoin_and_acks_all_needs_min_insync(tmp_path):
    """Broker 3 (the leader) advertises a TCP proxy, so its followers fetch through it."""
    topic = "cut"
    with FaultProxy(seed=13) as proxy, cluster(brokers=2, config=CONFIG, root=tmp_path) as two:
        leader = two.add_broker(start=False)
        leader.port = free_port()  # the proxy leads there before the broker starts: the
        proxy.upstream = ("127.0.0.1", leader.port)  # controller reaches it only through the proxy
        leader.extra_args += ["--advertised", proxy.address]
        leader.start()
        admin = AdminClient({"bootstrap.servers": two.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[3, 1, 2]],
                                      config={"min.insync.replicas": "2"})])[topic].result(60)
        bootstrap = two.bootstrap

        def isr():
            info = partition_info(bootstrap, topic)
            return info[2] if info is not None and info[0] == 3 else None

        wait_for(lambda: isr() == (1, 2, 3), what="a full ISR")
        with SteadyProducer(bootstrap, topic) as producer:
            wait_for(lambda: len(producer.acked) >= 100, what="records acknowledged")
            # Follower 1's fetches reach the leader but their answers never come back.
            proxy.drop_responses(1.0, api_key=FETCH, client_id="broker-1-fetcher-0")
            cut_at = time.monotonic()
            wait_for(lambda: isr() == (2, 3), what="broker 1 out of the ISR")
            assert time.monotonic() - cut_at >= LAG_MS / 1000 * 0.9  # not before replica.lag.time.max.ms
            acked = len(producer.acked)
            wait_for(lambda: len(producer.acked) >= acked + 100, what="acks=all with ISR [2, 3]")
            proxy.clear_faults()
            wait_for(lambda: isr() == (1, 2, 3), what="broker 1 back in the ISR")
            assert producer.stop() == 0
        assert producer.errors == []

        # kafka-python too, with its metadata ready before the cut.
        kp_waiting = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, retries=0,
                                   linger_ms=0, request_timeout_ms=60000)
        assert kp_waiting.partitions_for(topic) == {0}
        # Both followers cut off: the ISR shrinks to the leader, below min.insync.replicas.
        proxy.drop_responses(1.0, api_key=FETCH)
        # Sent as the cut begins: the leader appends them (its ISR has three members still) and
        # they wait for followers that get nothing more; when the ISR shrinks under them none
        # may be acknowledged: each is on the leader alone.
        waiting = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                            "retries": 0, "linger.ms": 0, "message.timeout.ms": 60000})
        waited = []
        for i in range(5):
            waiting.produce(topic, b"cut-%d" % i, on_delivery=lambda err, msg: waited.append(err))
        waiting.poll(0)
        kp_waited = [kp_waiting.send(topic, b"kp-cut-%d" % i) for i in range(5)]
        one = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})

        def shrunk():  # acks=1 keeps the leader's log growing, so the followers fall behind
            one.produce(topic, b"acks=1")
            one.flush(10)
            return isr() == (3,)
        wait_for(shrunk, what="the ISR down to the leader")
        kp_waiting.flush(60)
        assert all(isinstance(f.exception, (NotEnoughReplicasAfterAppendError, NotEnoughReplicasError))
                   for f in kp_waited), [f.exception or f.value for f in kp_waited]
        assert waiting.flush(60) == 0
        assert len(waited) == 5 and all(e is not None for e in waited), waited
        assert {e.code() for e in waited} <= {CKafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                             CKafkaError.NOT_ENOUGH_REPLICAS}, waited
        with pytest.raises(NotEnoughReplicasError):
            kp_waiting.send(topic, b"lonely-kp").get(60)
        kp_waiting.close()
        strict = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                           "retries": 0, "message.timeout.ms": 30000})
        outcome = []
        strict.produce(topic, b"lonely", on_delivery=lambda err, msg: outcome.append(err))
        strict.flush(60)
        assert [e.code() if e is not None else None for e in outcome] == [CKafkaError.NOT_ENOUGH_REPLICAS]
        proxy.clear_faults()
        wait_for(lambda: isr() == (1, 2, 3), what="both followers back in the ISR")


class SpreadProducer(SteadyProducer):
    """SteadyProducer over every partition of a topic: partition p gets 0, 1, 2, ... of its
    own, at most 50 in flight each, so a partition without a leader holds up only itself.
    Remembers when each record was sent and acknowledged, for the failover times."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(bootstrap, topic)
        self.sent: list[list[float]] = [[] for _ in range(partitions)]   # per partition: send time of record n
        self.acks: list[list[tuple[int, float]]] = [[] for _ in range(partitions)]  # (n, ack time)

    def _delivered(self, err, msg):
        if err is None:
            self.acks[msg.partition()].append((int(msg.value()), time.monotonic()))
        else:
            self.errors.append(f"{msg.partition()}: {err}")

    def _run(self):
        try:
            while not self._stop.is_set():
                for p, sent in enumerate(self.sent):
                    if len(sent) - len(self.acks[p]) < 50:
                        self.producer.produce(self.topic, str(len(sent)).encode(), partition=p,
                                              on_delivery=self._delivered)
                        sent.append(time.monotonic())
                self.producer.poll(0.005)
        except KafkaException as e:  # a fatal error: the idempotent producer gave up
            self.errors.append(str(e))

    def next_ack_after(self, partition: int, moment: float) -> float | None:
        """`first_ack_sent_after`, failing at once if the producer has failed."""
        assert self.errors == [], self.errors
        return self.first_ack_sent_after(partition, moment)

    def first_ack_sent_after(self, partition: int, moment: float) -> float | None:
        """When the first record produced after `moment` was acknowledged: only a new leader can have."""
        sent = self.sent[partition]
        return next((at for n, at in self.acks[partition] if sent[n] > moment), None)


class KafkaPythonSpreadProducer:
    """kafka-python's idempotent acks=all producer beside the SpreadProducer, on the same
    partitions: partition p gets kp-0, kp-1, ... of its own, at most 20 in flight each (a pure
    Python client: a slower pace leaves the CPU to the brokers)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                      linger_ms=5, delivery_timeout_ms=120000, retry_backoff_ms=100)
        self.topic = topic
        self.sent = [0] * partitions
        self.acks: list[list[int]] = [[] for _ in range(partitions)]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _failed(self, partition: int, n: int, exc: Exception) -> None:
        self.errors.append(f"{partition}: kp-{n}: {exc!r}")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for p, acks in enumerate(self.acks):
                    if self.sent[p] - len(acks) < 20 and not self.errors:
                        future = self.producer.send(self.topic, b"kp-%d" % self.sent[p], partition=p)
                        future.add_callback(lambda _, p=p, n=self.sent[p]: self.acks[p].append(n))
                        future.add_errback(self._failed, p, self.sent[p])
                        self.sent[p] += 1
                time.sleep(0.02)
        except Exception as e:  # the producer gave up: reported with the errors
            self.errors.append(repr(e))

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(120)
        self.producer.close()

    def __exit__(self, *exc):
        if not self._stop.is_set():
            self.stop()


def leaders_and_controller(bootstrap: str, topic: str) -> tuple[dict[int, int], int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p: info.leader for p, info in metadata.topics[topic].partitions.items()}, metadata.controller_id


def all_in_sync(three, topic: str, partitions: int) -> bool:
    infos = [partition_info(three.bootstrap, topic, p) for p in range(partitions)]
    return all(i is not None and i[0] > 0 and len(i[2]) == 3 for i in infos)


def elect_preferred(bootstrap: str, topic: str, partitions: int) -> bool:
    """ElectLeaders(PREFERRED) through a new client, which finds the current controller;
    False when the controller moved meanwhile (NOT_CONTROLLER), to be tried again."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(topic, p) for p in range(partitions)]).result(30)
    except KafkaException as e:
        if e.args[0].code() == CKafkaError.NOT_CONTROLLER:
            return False
        raise
    return True


BOUNCES = 10


def test_many_leader_bounces_lose_nothing_and_replicas_converge(three):
    """kill -9 of a partition's leader, again and again, every third time the controller's own
    partition; each round first moves leadership back to the preferred replicas (ElectLeaders),
    so that every broker leads one partition and the target is always a leader. kafka-python's
    idempotent producer writes the same partitions meanwhile, checked the same way."""
    topic, partitions = "bounced", 3
    create_replicated(three, topic, partitions)
    killed, failovers = [], []
    with SpreadProducer(three.bootstrap, topic, partitions) as producer, \
            KafkaPythonSpreadProducer(three.bootstrap, topic, partitions) as kp_producer:
        for round_ in range(BOUNCES):
            wait_for(lambda: all_in_sync(three, topic, partitions), what="every replica in sync")
            wait_for(lambda: elect_preferred(three.bootstrap, topic, partitions), what="a preferred election")
            leaders, controller = wait_for(lambda: (lambda lc: lc if sorted(lc[0].values()) == [1, 2, 3] else None)(
                leaders_and_controller(three.bootstrap, topic)), what="one partition led by each broker")
            others = sorted(set(three.brokers) - {controller})
            target = controller if round_ % 3 == 0 else others[round_ % 2]
            partition = next(p for p, leader in leaders.items() if leader == target)
            wait_for(lambda: all(len(a) >= 20 * (round_ + 1) for a in producer.acks + kp_producer.acks),
                     what="records of both producers acknowledged on every partition")
            three.brokers[target].kill()
            at_kill, wall = time.monotonic(), time.time()
            survivors = ",".join(h.bootstrap for i, h in three.brokers.items() if i != target)
            wait_for(lambda: (partition_info(survivors, topic, partition) or [-1])[0] not in (-1, target),
                     interval=0.1, what=f"a new leader of {topic}-{partition}")
            elected = time.monotonic() - at_kill  # to within the 0.1 s polling interval
            acked_at = wait_for(lambda: producer.next_ack_after(partition, at_kill),
                                what=f"an acknowledgement from {topic}-{partition}'s new leader")
            killed.append((target, target == controller))
            failovers.append((elected, acked_at - at_kill))
            print(f"bounce {round_ + 1} at {time.strftime('%H:%M:%S', time.gmtime(wall))}.{int(wall % 1 * 1000):03d}"
                  f": broker {target}{' (controller)' if target == controller else ''}, leader of {topic}-{partition}: "
                  f"new leader in Metadata after {elected:.2f} s, "
                  f"next acknowledged produce after {acked_at - at_kill:.2f} s")
            three.brokers[target].start()
        wait_for(lambda: all_in_sync(three, topic, partitions), what="every replica back in sync")
        assert producer.stop() == 0
        kp_producer.stop()
    assert (producer.errors, kp_producer.errors) == ([], [])
    print(f"acknowledged per partition: confluent-kafka {[len(a) for a in producer.acks]}, "
          f"kafka-python {[len(a) for a in kp_producer.acks]}")
    assert {b for b, _ in killed} == set(three.brokers) and sum(c for _, c in killed) >= 2
    for what, times in (("new leader in Metadata", sorted(e for e, _ in failovers)),
                        ("next acknowledged produce", sorted(a for _, a in failovers))):
        print(f"kill -9 to {what} over {len(times)} bounces: min {times[0]:.2f} s, "
              f"median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s")

    consumer = KafkaConsumer(bootstrap_servers=three.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10000)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    high_watermarks = consumer.end_offsets(tps)
    values = {p: [] for p in range(partitions)}
    kp_values = {p: [] for p in range(partitions)}
    for message in consumer:
        if message.value.startswith(b"kp-"):
            kp_values[message.partition].append(int(message.value[3:]))
        else:
            values[message.partition].append(int(message.value))
    consumer.close()
    for p in range(partitions):
        # Every record was acknowledged (flush left nothing, no errors): each partition holds
        # exactly the numbers each producer sent it, each once, in order.
        assert sorted(kp_producer.acks[p]) == list(range(kp_producer.sent[p]))
        assert kp_values[p] == list(range(kp_producer.sent[p]))
        assert sorted(n for n, _ in producer.acks[p]) == list(range(len(producer.sent[p])))
        assert values[p] == list(range(len(producer.sent[p])))
        assert len(values[p]) + len(kp_values[p]) == high_watermarks[tps[p]]
        logs = {i: segment_batches(h.data_dir, topic, high_watermarks[tps[p]], p) for i, h in three.brokers.items()}
        reference = logs[1]
        last = reference[-1]
        assert base_offset(last) + int.from_bytes(last[23:27], "big") + 1 == high_watermarks[tps[p]]
        for broker_id, batches in logs.items():
            assert batches == reference, f"broker {broker_id}'s log of {topic}-{p} differs"


def test_follower_that_lost_its_unflushed_tail_is_repaired_from_the_leader(three):
    """A follower's disk loses its last writes (its newest segment cut at restart, as after a
    power loss): once torn mid-batch, losing whole batches behind the tear, once at a batch
    boundary, losing whole batches only. Each time it rejoins the ISR and ends up with the
    leader's log batch by batch."""
    topic = "torn"
    create_replicated(three, topic)
    producer = Producer({"bootstrap.servers": three.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 0})
    sent = 0

    def produce(count: int) -> None:
        nonlocal sent
        for _ in range(count):  # one flush per record: one batch per record
            producer.produce(topic, str(sent).encode())
            sent += 1
            assert producer.flush(60) == 0

    produce(40)
    leader = partition_info(three.bootstrap, topic)[0]
    for follower, cut in zip(sorted(set(three.brokers) - {leader}), ("mid-batch", "batch boundary")):
        three.brokers[follower].kill()
        segment = max((three.brokers[follower].data_dir / f"{topic}-0").glob("*.log"))
        batches = segment_batches(three.brokers[follower].data_dir, topic, sent)
        assert len(batches) >= 10
        kept = sum(map(len, batches[:-6]))  # the last six batches go
        with open(segment, "r+b") as f:
            f.truncate(kept + (len(batches[-6]) // 2 if cut == "mid-batch" else 0))
        produce(10)  # acknowledged by the two others meanwhile
        three.brokers[follower].start()
        wait_for(lambda: (lambda i: i is not None and len(i[2]) == 3)(partition_info(three.bootstrap, topic)),
                 what=f"broker {follower} back in the ISR")
        produce(10)

    consumer = KafkaConsumer(bootstrap_servers=three.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    high_watermark = consumer.end_offsets([tp])[tp]
    assert [int(m.value) for m in consumer] == list(range(sent)) and high_watermark == sent
    consumer.close()
    logs = {i: segment_batches(h.data_dir, topic, high_watermark) for i, h in three.brokers.items()}
    assert len(logs[leader]) == sent
    for broker_id, batches in logs.items():
        assert batches == logs[leader], f"broker {broker_id}'s log differs from the leader's"


def test_consumers_detect_truncation_by_an_unclean_election(three):
    """KIP-320 with real consumers: both read offsets 0-19 from leader A while follower B is
    down; A dies, B (which has only 0-9) is elected uncleanly and takes 10-24. A consumer at
    20 that went on fetching would miss the new 10-19 without noticing; with its leader epoch
    it asks OffsetsForLeaderEpoch, learns that its epoch ends at 10 on B, and says so."""
    topic = "diverged"
    controller = AdminClient({"bootstrap.servers": three.bootstrap}).list_topics(timeout=10).controller_id
    a, b = sorted(set(three.brokers) - {controller})
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[a, b]], config={
        "min.insync.replicas": "1", "unclean.leader.election.enable": "true"})])[topic].result(60)
    wait_for(lambda: partition_info(three.bootstrap, topic) == (a, (a, b), (a, b)), what=f"{topic} led by {a}")
    producer = Producer({"bootstrap.servers": three.bootstrap, "acks": "all", "linger.ms": 0})

    def produce(prefix: str, offsets: range) -> None:
        for offset in offsets:
            producer.produce(topic, f"{prefix}-{offset}".encode())
        assert producer.flush(60) == 0

    produce("old", range(10))
    three.brokers[b].kill()
    wait_for(lambda: partition_info(three.bootstrap, topic) == (a, (a, b), (a,)), what=f"{b} out of the ISR")
    produce("old", range(10, 20))

    tp = TopicPartition(topic, 0)
    # kafka-python 3.0 drops the position's leader epoch when an empty fetch answers (it then
    # has nothing to validate), so its next fetch long-polls and is still waiting when A dies.
    python_consumer = KafkaConsumer(bootstrap_servers=three.bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="none", fetch_max_wait_ms=30000, request_timeout_ms=45000)
    python_consumer.assign([tp])
    python_consumer.seek(tp, 0)
    old = [f"old-{i}".encode() for i in range(20)]
    python_values = []
    while len(python_values) < 20:
        python_values += [m.value for m in python_consumer.poll(timeout_ms=1000).get(tp, [])]
    assert python_values == old
    rd_consumer = Consumer({"bootstrap.servers": three.bootstrap, "group.id": "kip-320", "enable.auto.commit": False,
                            "auto.offset.reset": "error"})
    rd_consumer.assign([CKTopicPartition(topic, 0, 0)])
    rd_values = [rd_consumer.poll(30) for _ in range(20)]
    assert [m.value() for m in rd_values if m is not None and m.error() is None] == old

    three.brokers[a].kill()
    three.brokers[b].start()  # the only live replica; unclean.leader.election.enable elects it
    wait_for(lambda: (partition_info(three.brokers[b].bootstrap, topic) or [None])[0] == b, what=f"{b} leading")
    produce("new", range(10, 25))

    def python_poll() -> None:
        records = python_consumer.poll(timeout_ms=1000).get(tp, [])
        assert records == [], f"kafka-python read {[r.value for r in records]} past the divergence"

    with pytest.raises(LogTruncationError) as truncation:
        wait_for(python_poll, timeout=60, what="kafka-python's validation")
    assert {tp: o.offset for tp, o in truncation.value.divergent_offsets.items()} == {tp: 10}
    python_consumer.close()
    rd_seen = []
    while not any(m.error() is not None for m in rd_seen):
        message = rd_consumer.poll(60)
        assert message is not None, f"librdkafka saw no truncation, only {rd_seen}"
        rd_seen.append(message)
    assert [m.value() for m in rd_seen[:-1]] == []  # nothing read past the divergence
    # auto.offset.reset=error: librdkafka reports the truncation instead of resetting.
    error = rd_seen[-1].error()
    assert error.code() == CKafkaError._AUTO_OFFSET_RESET and "log truncation detected" in error.str(), error
    assert "broker end offset is 10 " in error.str(), error
    rd_consumer.close()

    # The old leader comes back as a follower, cuts its log where it diverged and repairs it.
    three.brokers[a].start()
    wait_for(lambda: partition_info(three.bootstrap, topic) == (b, (a, b), (a, b)), what=f"{a} back in the ISR")
    repaired, leading = (segment_batches(three.brokers[i].data_dir, topic, 25) for i in (a, b))
    assert leading and base_offset(leading[-1]) >= 10 and repaired == leading
