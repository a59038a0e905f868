"""Seed 001's two failure schedules of high-watermark truncation, replayed on real `ottla serve`
processes on a real ZooKeeper (`tests/unit/test_replication_schedules.py` replays them on two
logs in one process).

Two brokers, A (the controller, leading) and B, one partition with replicas [A, B] and
min.insync.replicas=1, acks=all. The steps are reached with real faults: the failpoint
`replica.after_follower_append` (B killed -9 after a Fetch answer was appended and before
the HW it carries is taken), SIGSTOP of A (frozen, it can neither answer B nor, being the
controller, take B out of the ISR), kill -9, and a power loss simulated by cutting B's newest
segment back to what was fsynced.

1. Data loss: B has m0 and m1 but its HW is still 1 when it crashes; B restarts, A crashes
   before B fetches again, B is elected. Under HW truncation B would cut m1 at restart and
   the acknowledged m1 would be gone from both replicas. Then A takes its leadership back
   before B wrote in its own epoch, and B must go on replicating as a follower.
2. Divergence: A has m0 m1 with HW 2, B only m0 (its m1 was never fsynced); both crash, B
   comes back first, leads, and takes m2 at offset 1; then A comes back. Under HW truncation
   A would keep its m1 at offset 1 (its HW is 2) and the replicas would differ for good.

3. Divergence through a stale leader epoch checkpoint: schedule 2, but B is killed -9 after it
   led epoch 1 and took m2, before its checkpoint said where epoch 1 starts (a new leader's
   entry is written after it leads, by the disk worker; the failpoint `leader_epoch.hold_write`
   keeps that write from happening). Recovery must find epoch 1 in B's batches, else B answers
   A that epoch 0 ends at 2 and A keeps its m1 at offset 1.

Each test checks that the follower truncated where its leader's OffsetsForLeaderEpoch answer
said, that no acknowledged record is lost, and that the replicas are identical batch by batch
below the HW.
"""

from __future__ import annotations

import os

from confluent_kafka import ElectionType, Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from ottla.log.leader_epoch import CHECKPOINT_FILE, read_checkpoint
from ottla.log.log import HOLD_LEADER_EPOCH_WRITE
from ottla.log.manager import HIGH_WATERMARK_FILE, read_offset_checkpoint
from ottla.server.replica_fetcher import AFTER_FOLLOWER_APPEND
from ottla.testing import cluster
from tests.cluster_checks import partition_info, segment_batches
from tests.waiting import wait_for

TOPIC = "seed001"
# The HW checkpoint follows the in-memory HW closely, so the test can see what a crash leaves.
CONFIG = {"replica.high.watermark.checkpoint.interval.ms": 200, "replica.fetch.backoff.ms": 200,
          "controlled.shutdown.retry.backoff.ms": 500}  # the last broker's shutdown has nowhere to move leaders
EVERYTHING = 2**62
BOTH = (1, 2)  # the ISR with both brokers, as partition_info sorts it


def start_pair(two):
    """(A, B): A is the controller and leads the topic, B follows, both in the ISR."""
    controller = AdminClient({"bootstrap.servers": two.bootstrap}).list_topics(timeout=30).controller_id
    a = controller
    b = next(i for i in two.brokers if i != a)
    admin = AdminClient({"bootstrap.servers": two.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[a, b]],
                                  config={"min.insync.replicas": "1"})])[TOPIC].result(60)
    wait_for(lambda: partition_info(two.bootstrap, TOPIC) == (a, (a, b), BOTH), what="A leading, ISR [A, B]")
    return a, b


def isr_full(bootstrap: str) -> bool:
    info = partition_info(bootstrap, TOPIC)
    return info is not None and info[2] == BOTH


def produce(bootstrap: str, value: bytes) -> int:
    """One acks=all record; returns its offset once acknowledged (idempotent, so a retry
    after a leader change cannot write it twice)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "message.timeout.ms": 60000})
    outcome = []
    producer.produce(TOPIC, value, partition=0, on_delivery=lambda err, msg: outcome.append((err, msg.offset())))
    assert producer.flush(90) == 0
    [(error, offset)] = outcome
    assert error is None, error
    return offset


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


def truncated_by_epoch(handle, offset: int, leader: int) -> bool:
    """The follower's log says it truncated to `offset` on its leader's OffsetsForLeaderEpoch
    answer (the end of the follower's latest epoch there)."""
    return f"{TOPIC}-0 truncated to {offset} (leader {leader}'s end of epoch " in handle.read_stderr()


def assert_replicas_identical(two, a: int, b: int) -> None:
    info = partition_info(two.bootstrap, TOPIC)
    hw = len(values(two.brokers[info[0]].bootstrap))
    reference = batches(two.brokers[b], below=hw)
    assert reference, "no batches below the HW"
    assert batches(two.brokers[a], below=hw) == reference, "the replicas differ below the HW"


def test_schedule_1_follower_crash_with_stale_hw_then_leader_crash_loses_nothing(tmp_path):
    with cluster(brokers=2, config=CONFIG, root=tmp_path) as two:
        a, b = start_pair(two)
        broker_a, broker_b = two.brokers[a], two.brokers[b]
        assert produce(two.bootstrap, b"m0") == 0
        wait_for(lambda: checkpointed_hw(broker_b) == 1, what="B's HW at 1")

        # B restarts with the failpoint armed and rejoins the ISR (its HW is 1 from the checkpoint).
        broker_b.env = {"OTTLA_FAILPOINTS": AFTER_FOLLOWER_APPEND}
        broker_b.restart()
        wait_for(lambda: partition_info(two.bootstrap, TOPIC) == (a, (a, b), BOTH), what="B back in the ISR")

        # m1: B fetches it (HW 1 in that answer); B's next Fetch moves A's HW to 2, which
        # acknowledges m1; B dies before it takes HW 2 from the answer.
        assert produce(broker_a.bootstrap, b"m1") == 1
        wait_for(lambda: not broker_b.running(), what="B to crash at the failpoint")
        broker_a.pause()  # A (leader and controller) is frozen before it could take B out of the ISR
        assert f"failpoint {AFTER_FOLLOWER_APPEND}" in broker_b.read_stderr()
        assert checkpointed_hw(broker_b) == 1 and len(batches(broker_b)) == 2  # the exact step of seed 001

        broker_b.env = {}
        broker_b.start()  # B restarts; under HW truncation it would cut m1 here
        broker_a.kill()  # A crashes before B fetched from it again
        wait_for(lambda: (partition_info(broker_b.bootstrap, TOPIC) or (None,))[0] == b, what="B elected leader")
        assert values(broker_b.bootstrap) == [b"m0", b"m1"]

        broker_a.start()  # A becomes B's follower
        wait_for(lambda: isr_full(two.bootstrap), what="A back in the ISR")
        assert truncated_by_epoch(broker_a, 2, b)
        # A takes its leadership back before B wrote anything in its own epoch: B, follower
        # again, must drop that empty epoch and go on replicating.
        admin = AdminClient({"bootstrap.servers": two.bootstrap})
        admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(TOPIC, 0)]).result(60)
        wait_for(lambda: partition_info(two.bootstrap, TOPIC) == (a, (a, b), BOTH), what="A leading again")
        assert produce(two.bootstrap, b"m2") == 2
        assert values(two.bootstrap) == [b"m0", b"m1", b"m2"]  # every acknowledged record, in order
        assert_replicas_identical(two, a, b)


def both_crash_with_m1_lost_on_b(two):
    """The start of schedules 2 and 3: A has m0 m1 with HW 2, B has both too; both machines
    go down and B loses power, so its copy of m1 is gone (followers never fsync,
    flush.messages). Returns (A, B) as ids and handles, both stopped."""
    a, b = start_pair(two)
    broker_a, broker_b = two.brokers[a], two.brokers[b]
    assert produce(two.bootstrap, b"m0") == 0
    assert produce(two.bootstrap, b"m1") == 1
    wait_for(lambda: checkpointed_hw(broker_a) == 2 and len(batches(broker_b)) == 2, what="HW 2 with m1 on B")
    broker_a.kill()
    broker_b.kill()
    [segment] = sorted((broker_b.data_dir / f"{TOPIC}-0").glob("*.log"))
    with open(segment, "r+b") as f:
        f.truncate(len(batches(broker_b)[0]))
        os.fsync(f.fileno())
    assert checkpointed_hw(broker_a) == 2 and len(batches(broker_a)) == 2
    assert len(batches(broker_b)) == 1
    return a, b, broker_a, broker_b


def test_schedule_2_both_crash_and_the_short_follower_leads_without_divergence(tmp_path):
    with cluster(brokers=2, config=CONFIG, root=tmp_path) as two:
        a, b, broker_a, broker_b = both_crash_with_m1_lost_on_b(two)
        broker_b.start()  # B comes back first and is elected
        wait_for(lambda: (partition_info(broker_b.bootstrap, TOPIC) or (None,))[0] == b, what="B elected leader")
        assert produce(broker_b.bootstrap, b"m2") == 1  # the offset A holds m1 at

        broker_a.start()  # A, with HW 2, becomes B's follower
        wait_for(lambda: isr_full(two.bootstrap), what="A back in the ISR")
        assert truncated_by_epoch(broker_a, 1, b)  # B's end of epoch 0, below A's HW of 2
        assert values(two.bootstrap) == [b"m0", b"m2"]
        assert_replicas_identical(two, a, b)


def test_a_new_leader_killed_before_its_epoch_checkpoint_was_written_recovers_it_and_does_not_diverge(tmp_path):
    with cluster(brokers=2, config=CONFIG, root=tmp_path) as two:
        a, b, broker_a, broker_b = both_crash_with_m1_lost_on_b(two)
        broker_b.env = {"OTTLA_FAILPOINTS": HOLD_LEADER_EPOCH_WRITE}
        broker_b.start()
        wait_for(lambda: (partition_info(broker_b.bootstrap, TOPIC) or (None,))[0] == b, what="B elected leader")
        assert produce(broker_b.bootstrap, b"m2") == 1  # epoch 1's first batch, at the offset A holds m1 at
        broker_b.kill()
        checkpoint = broker_b.data_dir / f"{TOPIC}-0" / CHECKPOINT_FILE
        assert read_checkpoint(checkpoint) == [(0, 0)]  # the window: epoch 1 led and written in, not checkpointed

        broker_b.env = {}
        broker_b.start()  # recovers, leads epoch 2
        wait_for(lambda: (partition_info(broker_b.bootstrap, TOPIC) or (None,))[0] == b, what="B leading again")
        assert values(broker_b.bootstrap) == [b"m0", b"m2"]
        broker_a.start()  # A, with m0 m1 in epoch 0, becomes B's follower
        wait_for(lambda: isr_full(two.bootstrap), what="A back in the ISR")
        assert truncated_by_epoch(broker_a, 1, b)  # where epoch 0 ended on B, as B's batches say
        assert values(two.bootstrap) == [b"m0", b"m2"]
        assert_replicas_identical(two, a, b)
