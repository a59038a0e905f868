"""Seed 001's two failure schedules of high-watermark truncation, replayed on three real
`ottla serve` processes on a real ZooKeeper (`tests/unit/test_replication_schedules.py`
replays the seed's two-replica version on two logs in one process).

Three brokers: A (the controller, leading), B and C; one partition with replicas [A, B, C],
replication factor 3, min.insync.replicas=2, acks=all, unclean leader election off. In each
schedule C is first taken out of the ISR: it stops fetching (killed -9 in schedule 1,
SIGSTOPped in 2 and 3), and once a record has waited for it past replica.lag.time.max.ms A
drops it (ISR [A, B] still meets min.insync.replicas; or the controller does, when C's
ZooKeeper session expires first), so that record lives on exactly A and B, as on the seed's
two replicas. The other steps are reached with real faults too: the
failpoint `replica.after_follower_append` (B killed -9 after a Fetch answer was appended and
before the HW it carries is taken), SIGSTOP of A (frozen, it can neither answer B nor, being
the controller, take B out of the ISR), kill -9, and a power loss simulated by cutting B's
newest segment back to what was fsynced. C comes back while B leads and is repaired from it.

1. Data loss: B has m0 and m1 but its HW is still 1 when it crashes; B restarts, A crashes
   before B fetches again, and B must be elected (C, back and alive, is not in the ISR).
   Under HW truncation B would cut m1 at restart and the acknowledged m1 would be gone.
   C is then repaired from B; A comes back as B's follower, takes its leadership back
   before B wrote in its own epoch, and B must go on replicating as a follower.
2. Divergence: A has m0 m1 with HW 2, B only m0 (its m1 was never fsynced); A and B crash,
   B comes back first and leads, C (repaired from B) joins its ISR, and B takes m2 at
   offset 1. Then A comes back: under HW truncation it would keep its m1 at offset 1 (its HW
   is 2) and the replicas would differ for good. m1 was sent with acks=0: the power loss
   may take it, as it took it in the seed, but it was never acknowledged.
3. Divergence through a stale leader epoch checkpoint: schedule 2, but B is killed -9 (after
   C, which would otherwise lead) once it led its epoch and took m2, before its checkpoint
   said where that epoch starts (a new leader's entry is written after it leads, by the disk
   worker; the failpoint `leader_epoch.hold_write` keeps that write from happening). B leads
   again; its recovery must find the epoch in its batches, else it answers A that epoch 0
   ends at 2 and A keeps its m1 at offset 1.

Each test checks that every follower truncated where its leader's OffsetsForLeaderEpoch
answer said, that no acknowledged record is lost, and that the three replicas are identical
batch by batch below the HW. Producers: confluent-kafka in 1 and for m2 in 3, kafka-python
in 2 and for m0 and m1 in 2 and 3; consumers: kafka-python.
"""

from __future__ import annotations

import json
import os

from confluent_kafka import ElectionType, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kazoo.client import KazooClient

from ottla.log.leader_epoch import CHECKPOINT_FILE, read_checkpoint
from ottla.log.log import HOLD_LEADER_EPOCH_WRITE
from ottla.log.manager import HIGH_WATERMARK_FILE, read_offset_checkpoint
from ottla.server.replica_fetcher import AFTER_FOLLOWER_APPEND
from ottla.testing import cluster
from tests.cluster_checks import partition_info, segment_batches
from tests.waiting import wait_for

TOPIC = "seed001"
LAG_MS = 2000
# The HW checkpoint follows the in-memory HW closely, so the test can see what a crash
# leaves; no automatic preferred-leader election: it moved the partition back to A as soon
# as A rejoined the ISR, between two steps of a schedule.
CONFIG = {"replica.lag.time.max.ms": LAG_MS, "replica.high.watermark.checkpoint.interval.ms": 200,
          "replica.fetch.backoff.ms": 200, "auto.leader.rebalance.enable": False}
SESSION_MS = 4000  # a broker restarted after kill -9 waits this long for its old registration
EVERYTHING = 2**62


def start_three(three):
    """(A, B, C) as ids: A is the controller and leads the topic, all three in the ISR."""
    a = AdminClient({"bootstrap.servers": three.bootstrap}).list_topics(timeout=30).controller_id
    b, c = sorted(i for i in three.brokers if i != a)
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[a, b, c]],
                                  config={"min.insync.replicas": "2"})])[TOPIC].result(60)
    wait_for(lambda: partition_info(three.bootstrap, TOPIC) == (a, (a, b, c), tuple(sorted((a, b, c)))),
             what="A leading, ISR [A, B, C]")
    return a, b, c


def leader(handle) -> int | None:
    """The partition's leader as `handle`'s metadata names it."""
    info = partition_info(handle.bootstrap, TOPIC)
    return None if info is None else info[0]


def isr(handle) -> tuple[int, ...] | None:
    info = partition_info(handle.bootstrap, TOPIC)
    return None if info is None else info[2]


def zookeeper_state(three) -> tuple[int, list[int]]:
    """(leader, ISR) as the partition's state znode has them: what an election will read."""
    zk = KazooClient(hosts=three.connect)
    zk.start(timeout=30)
    try:
        state = json.loads(zk.get(f"/brokers/topics/{TOPIC}/partitions/0/state")[0])
    finally:
        zk.stop()
        zk.close()
    return state["leader"], sorted(state["isr"])


def ck_producer(bootstrap: str) -> Producer:
    """An idempotent acks=all confluent-kafka producer (a retry after a leader change cannot
    write twice), with the topic's metadata already fetched so its first record goes at once."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "message.timeout.ms": 60000})
    producer.list_topics(TOPIC, timeout=30)
    return producer


def produce_ck(producer: Producer, value: bytes) -> int:
    """One record; its offset once acknowledged."""
    outcome = []
    producer.produce(TOPIC, value, partition=0, on_delivery=lambda err, msg: outcome.append((err, msg.offset())))
    assert producer.flush(90) == 0
    [(error, offset)] = outcome
    assert error is None, error
    return offset


def produce_kp(bootstrap: str, value: bytes) -> int:
    """One acks=all record through an idempotent kafka-python producer; its offset once acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                             request_timeout_ms=30000)
    try:
        return producer.send(TOPIC, value, partition=0).get(90).offset
    finally:
        producer.close()


def values(bootstrap: str) -> list[bytes]:
    """Every record below the HW, through a real consumer."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=10000)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    end = consumer.end_offsets([tp])[tp]
    out = []
    for message in consumer:
        out.append(message.value)
        if message.offset + 1 >= end:
            break
    consumer.close()
    return out


def checkpointed_hw(handle) -> int | None:
    return read_offset_checkpoint(handle.data_dir / HIGH_WATERMARK_FILE).get((TOPIC, 0))


def batches(handle, below: int = EVERYTHING) -> list[bytes]:
    return segment_batches(handle.data_dir, TOPIC, below)


def mark(handle) -> int:
    """Where the broker's log ends now, so a check reads only what it logs afterwards."""
    return len(handle.read_stderr())


def truncated_by_epoch(handle, since: int, offset: int, leader_id: int) -> bool:
    """Since `since`, the follower's log says it truncated to `offset` on its leader's
    OffsetsForLeaderEpoch answer (the end of the follower's latest epoch there)."""
    return f"{TOPIC}-0 truncated to {offset} (leader {leader_id}'s end of epoch " in handle.read_stderr()[since:]


def assert_replicas_identical(three) -> None:
    """All three logs the same batch by batch below the HW, and the HW covers them."""
    bootstrap = ",".join(h.bootstrap for h in three.brokers.values())
    hw = len(values(bootstrap))
    logs = {i: batches(h, below=hw) for i, h in three.brokers.items()}
    reference = next(iter(logs.values()))
    assert len(reference) == hw, "the HW is not the end of the batches below it"
    for broker_id, log in logs.items():
        assert log == reference, f"broker {broker_id}'s replica differs below the HW"


def test_schedule_1_follower_crash_with_stale_hw_then_leader_crash_loses_nothing(tmp_path):
    with cluster(brokers=3, config=CONFIG, session_timeout_ms=SESSION_MS, root=tmp_path) as three:
        a, b, c = start_three(three)
        broker_a, broker_b, broker_c = (three.brokers[i] for i in (a, b, c))
        assert produce_ck(ck_producer(three.bootstrap), b"m0") == 0
        wait_for(lambda: checkpointed_hw(broker_b) == 1 == checkpointed_hw(broker_c), what="HW 1 on B and C")

        # B restarts with the failpoint armed and rejoins the ISR (its HW is 1 from the checkpoint).
        broker_b.env = {"OTTLA_FAILPOINTS": AFTER_FOLLOWER_APPEND}
        broker_b.restart()
        wait_for(lambda: isr(broker_a) == tuple(sorted((a, b, c))), what="B back in the ISR")

        # C crashes. m1: B fetches it (HW 1 in that answer); the HW waits for C until A drops C
        # from the ISR past replica.lag.time.max.ms, then moves to 2 on B's next Fetch, which
        # acknowledges m1 (on A and B only); B dies before it takes HW 2 from the answer.
        # (killed rather than stopped: a stopped C could still take m1 from a Fetch answer
        # already on its socket when it resumes)
        producer = ck_producer(broker_a.bootstrap)
        broker_c.kill()
        assert produce_ck(producer, b"m1") == 1
        wait_for(lambda: not broker_b.running(), what="B to crash at the failpoint")
        broker_a.pause()  # A (leader and controller) is frozen before it could take B out of the ISR
        assert f"failpoint {AFTER_FOLLOWER_APPEND}" in broker_b.read_stderr()
        assert checkpointed_hw(broker_b) == 1 and len(batches(broker_b)) == 2  # the exact step of seed 001
        assert len(batches(broker_c)) == 1 and zookeeper_state(three) == (a, sorted((a, b)))

        broker_b.env = {}
        since_b, since_c = mark(broker_b), mark(broker_c)
        broker_b.start()  # B restarts; under HW truncation it would cut m1 here
        broker_a.kill()  # A crashes before B fetched from it again
        broker_c.start()  # C, back but out of the ISR, must not lead (no unclean election)
        wait_for(lambda: leader(broker_b) == b, what="B elected leader")
        assert values(broker_b.bootstrap) == [b"m0", b"m1"]
        wait_for(lambda: isr(broker_b) == tuple(sorted((b, c))), what="C repaired from B, in its ISR")
        assert truncated_by_epoch(broker_c, since_c, 1, b)
        assert "truncated to" not in broker_b.read_stderr()[since_b:]

        since_a = mark(broker_a)
        broker_a.start()  # A becomes B's follower
        wait_for(lambda: isr(broker_b) == tuple(sorted((a, b, c))), what="A back in the ISR")
        assert truncated_by_epoch(broker_a, since_a, 2, b)
        # A takes its leadership back before B wrote anything in its own epoch: B, follower
        # again, must drop that empty epoch and go on replicating.
        admin = AdminClient({"bootstrap.servers": three.bootstrap})
        admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(TOPIC, 0)]).result(60)
        wait_for(lambda: partition_info(three.bootstrap, TOPIC) == (a, (a, b, c), tuple(sorted((a, b, c)))),
                 what="A leading again with the full ISR")
        assert produce_ck(ck_producer(three.bootstrap), b"m2") == 2
        assert values(three.bootstrap) == [b"m0", b"m1", b"m2"]  # every acknowledged record, in order
        assert_replicas_identical(three)


def both_crash_with_m1_lost_on_b(three):
    """The start of schedules 2 and 3: m0 on all three; C stopped; m1 (acks=0) on A and B,
    committed (HW 2) once A dropped C from the ISR; A and B go down and B loses power, so its
    copy of m1 is gone (followers never fsync, flush.messages). Returns the ids and handles
    of A, B and C: A and B stopped, C still SIGSTOPped."""
    a, b, c = start_three(three)
    broker_a, broker_b, broker_c = (three.brokers[i] for i in (a, b, c))
    assert produce_kp(three.bootstrap, b"m0") == 0
    wait_for(lambda: checkpointed_hw(broker_c) == 1, what="HW 1 on C")
    unacknowledged = KafkaProducer(bootstrap_servers=broker_a.bootstrap, acks=0, linger_ms=0)
    assert unacknowledged.partitions_for(TOPIC) == {0}  # metadata ready: m1 goes as soon as C stops
    broker_c.pause()
    unacknowledged.send(TOPIC, b"m1", partition=0)
    unacknowledged.close()
    wait_for(lambda: checkpointed_hw(broker_a) == 2 and len(batches(broker_b)) == 2, what="HW 2 with m1 on B")
    assert len(batches(broker_c)) == 1 and zookeeper_state(three) == (a, sorted((a, b)))
    broker_a.kill()
    broker_b.kill()
    [segment] = sorted((broker_b.data_dir / f"{TOPIC}-0").glob("*.log"))
    with open(segment, "r+b") as f:
        f.truncate(len(batches(broker_b)[0]))
        os.fsync(f.fileno())
    assert checkpointed_hw(broker_a) == 2 and len(batches(broker_a)) == 2
    assert len(batches(broker_b)) == 1
    return (a, b, c), (broker_a, broker_b, broker_c)


def b_leads_with_c_in_its_isr(ids, handles) -> None:
    """B comes back first and is elected (it is in the ISR; A is down, C is not in it); C,
    resumed, becomes its follower, truncates where B says its epoch 0 ends and joins the ISR."""
    (a, b, c), (broker_a, broker_b, broker_c) = ids, handles
    since_c = mark(broker_c)
    broker_b.start()
    broker_c.resume()
    wait_for(lambda: leader(broker_b) == b, what="B elected leader")
    wait_for(lambda: isr(broker_b) == tuple(sorted((b, c))), what="C repaired from B, in its ISR")
    assert truncated_by_epoch(broker_c, since_c, 1, b)


def test_schedule_2_both_crash_and_the_short_follower_leads_without_divergence(tmp_path):
    with cluster(brokers=3, config=CONFIG, session_timeout_ms=SESSION_MS, root=tmp_path) as three:
        ids, handles = both_crash_with_m1_lost_on_b(three)
        (a, b, c), (broker_a, broker_b, broker_c) = ids, handles
        b_leads_with_c_in_its_isr(ids, handles)
        assert produce_kp(broker_b.bootstrap, b"m2") == 1  # acks=all on B and C, at the offset A holds m1 at

        since_a = mark(broker_a)
        broker_a.start()  # A, with HW 2, becomes B's follower
        wait_for(lambda: isr(broker_b) == tuple(sorted((a, b, c))), what="A back in the ISR")
        assert truncated_by_epoch(broker_a, since_a, 1, b)  # B's end of epoch 0, below A's HW of 2
        assert values(three.bootstrap) == [b"m0", b"m2"]
        assert_replicas_identical(three)


def test_a_new_leader_killed_before_its_epoch_checkpoint_was_written_recovers_it_and_does_not_diverge(tmp_path):
    with cluster(brokers=3, config=CONFIG, session_timeout_ms=SESSION_MS, root=tmp_path) as three:
        ids, handles = both_crash_with_m1_lost_on_b(three)
        (a, b, c), (broker_a, broker_b, broker_c) = ids, handles
        broker_b.env = {"OTTLA_FAILPOINTS": HOLD_LEADER_EPOCH_WRITE}
        b_leads_with_c_in_its_isr(ids, handles)
        # m2: the first batch of B's epoch, at the offset A holds m1 at
        assert produce_ck(ck_producer(broker_b.bootstrap), b"m2") == 1
        # C first: with C alive in the ISR, B's crash would make C the leader.
        broker_c.kill()
        broker_b.kill()
        checkpoint = broker_b.data_dir / f"{TOPIC}-0" / CHECKPOINT_FILE
        assert read_checkpoint(checkpoint) == [(0, 0)]  # the window: B's epoch led and written in, not checkpointed

        broker_b.env = {}
        broker_b.start()  # recovers, leads a new epoch (first in the ISR [B, C] by assignment)
        wait_for(lambda: leader(broker_b) == b and isr(broker_b) == (b,), what="B leading again, C out of the ISR")
        assert values(broker_b.bootstrap) == [b"m0", b"m2"]
        since_a = mark(broker_a)
        broker_a.start()  # A, with m0 m1 in epoch 0, becomes B's follower
        wait_for(lambda: isr(broker_b) == tuple(sorted((a, b))), what="A in the ISR")
        assert truncated_by_epoch(broker_a, since_a, 1, b)  # where epoch 0 ended on B, as B's batches say
        since_c = mark(broker_c)
        broker_c.start()  # C, with m2 in B's former epoch, keeps it
        wait_for(lambda: isr(broker_b) == tuple(sorted((a, b, c))), what="C back in the ISR")
        assert truncated_by_epoch(broker_c, since_c, 2, b)
        assert values(three.bootstrap) == [b"m0", b"m2"]
        assert_replicas_identical(three)
