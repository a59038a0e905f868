"""A follower's fetches in an incremental fetch session (KIP-227), on a real ZooKeeper and two
real brokers: the leader advertises a TCP proxy that keeps a copy of the follower's Fetch
requests, so what the follower sends is read off the wire."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.protocol.codec import decode_request
from ottla.testing import cluster
from ottla.testing.zookeeper import free_port
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for

FETCH = 1
PARTITIONS = 100
TOPIC = "followed"


def _isr_full(bootstrap) -> bool:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10)
    topic = metadata.topics.get(TOPIC)
    return (topic is not None and topic.error is None and len(topic.partitions) == PARTITIONS
            and all(p.leader == 2 and sorted(p.isrs) == [1, 2] for p in topic.partitions.values()))


def _named(frame: bytes):
    """(session id, epoch, partitions named, partitions forgotten) of a recorded Fetch."""
    request = decode_request(frame, {FETCH: (0, 18)}).body
    named = [(t.topic, p.partition, p.fetch_offset) for t in request.topics for p in t.partitions]
    forgotten = [(t.topic, p) for t in request.forgotten_topics_data for p in t.partitions]
    return request.session_id, request.session_epoch, named, forgotten


def test_an_idle_follower_fetches_nothing_by_name_and_then_only_what_moved(tmp_path):
    with FaultProxy(seed=5) as proxy, cluster(brokers=1, config={"replica.fetch.wait.max.ms": 200},
                                              root=tmp_path) as one:
        leader = one.add_broker(start=False)
        leader.port = free_port()
        proxy.upstream = ("127.0.0.1", leader.port)
        leader.extra_args += ["--advertised", proxy.address]
        leader.start()
        admin = AdminClient({"bootstrap.servers": one.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS,
                                      replica_assignment=[[2, 1]] * PARTITIONS)])[TOPIC].result(60)
        wait_for(lambda: _isr_full(one.bootstrap), what="broker 1 in the ISR of every partition")

        proxy.record_requests(FETCH, client_id="broker-1-fetcher-0")
        # Idle once the start is behind it: partitions the leader refused at first (not yet their
        # leader) back off, are forgotten by the session and named again when they are retried.
        wait_for(lambda: len(proxy.recorded) >= 3 and all(
            _named(frame)[2:] == ([], []) for frame in proxy.recorded[-3:]), what="three fetches naming nothing")
        idle_from = len(proxy.recorded) - 3
        session_id, epoch, _, _ = _named(proxy.recorded[idle_from])
        assert session_id != 0 and epoch > 0

        # acks=all: each record is acknowledged once the follower has fetched it.
        producer = Producer({"bootstrap.servers": one.bootstrap, "acks": "all", "linger.ms": 0})
        for _ in range(3):
            producer.produce(TOPIC, b"moved", partition=7)
            assert producer.flush(30) == 0
        seen = len(proxy.recorded)
        wait_for(lambda: len(proxy.recorded) >= seen + 3, what="three more fetches")
        rounds = [_named(frame) for frame in proxy.recorded[idle_from:]]
        assert {s for s, _, _, _ in rounds} == {session_id}  # one session all along
        epochs = [e for _, e, _, _ in rounds]
        assert epochs == list(range(epochs[0], epochs[0] + len(epochs)))
        # Only partition 7 was ever named again, at the offsets its records moved it to.
        assert {(t, p) for _, _, named, _ in rounds for t, p, _ in named} == {(TOPIC, 7)}
        assert [o for _, _, named, _ in rounds for _, _, o in named] == [1, 2, 3]
        assert proxy.errors == []
