"""Partitions and the replica manager on real logs: roles, the high watermark over the ISR,
acks=all waiting for it, and what a lost leadership answers."""

import asyncio
import time
import uuid

import pytest

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log.manager import LogManager
from ottla.records.records import Record, build_batch
from ottla.server import replica_manager
from ottla.server.metadata_cache import MetadataCache, PartitionState
from ottla.server.replica_manager import ReplicaManager

E = ErrorCode
NOW = int(time.time() * 1000)


def batch(n=1):
    return build_batch([Record(b"k", b"v%d" % i) for i in range(n)])


@pytest.fixture
def manager(tmp_path):
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("t", 2, {})
    yield ReplicaManager(1, logs)
    logs.close()


def lead(manager, partition=0, epoch=0, isr=(1,), replicas=(1,)):
    return manager.apply_partition_states([PartitionState("t", partition, 1, epoch, replicas, isr)], now_ms=NOW)


def test_leader_appends_and_moves_the_high_watermark_to_the_isr_minimum(manager):
    seen = []
    manager.add_leadership_listener(lambda *args: seen.append(args))
    assert lead(manager, isr=(1, 2), replicas=(1, 2)) == {("t", 0): E.none}
    assert seen == [("t", 0, True, 0)]
    partition = manager.get_partition("t", 0)
    manager.append("t", 0, batch(3), now_ms=NOW)
    assert (partition.log_end_offset, partition.high_watermark) == (3, 0)  # follower 2 has nothing yet
    assert partition.update_follower_fetch(2, 2, now_ms=NOW + 5)
    assert partition.high_watermark == 2
    partition.update_follower_fetch(2, 3, now_ms=NOW + 6)
    assert partition.high_watermark == 3 and partition.followers[2].last_caught_up_ms == NOW + 6
    # the batches carry the leader epoch
    manager.apply_partition_states([PartitionState("t", 0, 1, 4, (1,), (1,))])
    manager.append("t", 0, batch(), now_ms=NOW)
    assert partition.log.read(3, 1 << 20, max_offset=4).records[12:16] == (4).to_bytes(4, "big")


def test_not_leader_answers(manager):
    with pytest.raises(KafkaError) as e:
        manager.append("t", 0, batch(), now_ms=NOW)
    assert e.value.code == E.unknown_topic_or_partition  # no role given yet
    manager.apply_partition_states([PartitionState("t", 0, 2, 1, (1, 2), (1, 2))])
    assert not manager.get_partition("t", 0).is_leader
    with pytest.raises(KafkaError) as e:
        manager.append("t", 0, batch(), now_ms=NOW)
    assert e.value.code == E.not_leader_or_follower
    # an older leader epoch is fenced and changes nothing
    assert manager.apply_partition_states([PartitionState("t", 0, 1, 0, (1, 2), (1, 2))]) == {
        ("t", 0): E.fenced_leader_epoch}
    assert manager.get_partition("t", 0).leader_id == 2


def test_acks_all_waits_for_the_high_watermark(manager):
    async def scenario():
        lead(manager, isr=(1, 2), replicas=(1, 2))
        lead(manager, partition=1)
        partition = manager.get_partition("t", 0)
        produce = asyncio.ensure_future(manager.append_records(
            {("t", 0): batch(2), ("t", 1): batch()}, acks=-1, timeout_ms=60_000, now_ms=NOW))
        await asyncio.sleep(0.05)
        assert not produce.done()  # partition 0 waits for follower 2
        partition.update_follower_fetch(2, 2, now_ms=NOW)
        manager.high_watermark_moved("t", 0)
        results = await produce
        assert [(r.error, r.base_offset) for r in results.values()] == [(E.none, 0), (E.none, 0)]
        # acks=1 answers without the follower; a timeout answers REQUEST_TIMED_OUT
        one = await manager.append_records({("t", 0): batch()}, acks=1, timeout_ms=0, now_ms=NOW)
        assert one[("t", 0)].error == E.none and partition.high_watermark == 2
        late = await manager.append_records({("t", 0): batch()}, acks=-1, timeout_ms=10, now_ms=NOW)
        assert late[("t", 0)].error == E.request_timed_out
        # a single-member ISR acknowledges acks=all at once
        alone = await manager.append_records({("t", 1): batch()}, acks=-1, timeout_ms=0, now_ms=NOW)
        assert alone[("t", 1)].error == E.none and manager.get_partition("t", 1).high_watermark == 2
    asyncio.run(scenario())


def test_a_leader_alone_in_its_isr_answers_acks_all_in_the_append(manager, monkeypatch):
    """The sinks' requests on one broker: the HW passes each batch in its own append, so acks=all
    is answered there, with no future or waiter per batch (`_acks_all_future` is for a wait); a
    partition with a follower still waits, the other answering in the same request."""
    waited = []
    real = manager._acks_all_future
    monkeypatch.setattr(manager, "_acks_all_future", lambda *args: waited.append(args[:2]) or real(*args))

    async def scenario():
        lead(manager)
        lead(manager, partition=1, isr=(1, 2), replicas=(1, 2))
        alone = await manager.append_records({("t", 0): batch(3)}, acks=-1, timeout_ms=0, now_ms=NOW)
        assert alone[("t", 0)].error == E.none and waited == []
        both = await manager.append_records({("t", 0): batch(), ("t", 1): batch()}, acks=-1, timeout_ms=10,
                                            now_ms=NOW)
        assert [(k, r.error, r.base_offset) for k, r in both.items()] == [
            (("t", 0), E.none, 3), (("t", 1), E.request_timed_out, -1)]
        assert waited == [("t", 1)]
    asyncio.run(scenario())


def test_losing_leadership_answers_the_waiters(manager):
    lead(manager, isr=(1, 2), replicas=(1, 2))
    manager.append("t", 0, batch(), now_ms=NOW)
    answers = []
    manager.after_high_watermark("t", 0, 1, answers.append)
    assert answers == []
    manager.apply_partition_states([PartitionState("t", 0, 2, 1, (1, 2), (2,))])
    assert answers == [E.not_leader_or_follower]
    manager.after_high_watermark("t", 0, 0, answers.append)
    assert answers[-1] == E.not_leader_or_follower


def test_removed_partitions_are_forgotten(manager):
    seen = []
    lead(manager)
    manager.add_leadership_listener(lambda *args: seen.append(args))
    manager.remove_partitions([("t", 0)])
    assert manager.get_partition("t", 0) is None and seen == [("t", 0, False, 0)]


def test_min_insync_replicas_refuses_acks_all_below_it_and_after_a_shrink(tmp_path):
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("m", 1, {"min.insync.replicas": 2})
    manager = ReplicaManager(1, logs)

    async def scenario():
        manager.apply_partition_states([PartitionState("m", 0, 1, 0, (1, 2), (1,))], now_ms=NOW)
        refused = await manager.append_records({("m", 0): batch()}, acks=-1, timeout_ms=1000, now_ms=NOW)
        assert refused[("m", 0)].error == E.not_enough_replicas
        assert manager.get_partition("m", 0).log_end_offset == 0  # refused before the append
        one = await manager.append_records({("m", 0): batch()}, acks=1, timeout_ms=1000, now_ms=NOW)
        assert one[("m", 0)].error == E.none  # acks=1 does not ask for the ISR
        # ISR [1, 2]: the produce waits for 2; the ISR shrinks to [1] meanwhile and the HW passes
        # the batch: written, but the guarantee is not met
        manager.apply_partition_states([PartitionState("m", 0, 1, 0, (1, 2), (1, 2))], now_ms=NOW)
        partition = manager.get_partition("m", 0)
        produce = asyncio.ensure_future(manager.append_records({("m", 0): batch()}, acks=-1, timeout_ms=60_000,
                                                               now_ms=NOW))
        await asyncio.sleep(0.05)
        assert not produce.done()
        assert partition.propose_isr_shrink(NOW + 31_000) == frozenset({1})
        assert partition.isr_committed({1}, zk_version=1)
        manager.high_watermark_moved("m", 0)
        assert (await produce)[("m", 0)].error == E.not_enough_replicas_after_append
    try:
        asyncio.run(scenario())
    finally:
        logs.close()


def test_a_follower_fetch_moves_the_high_watermark_and_asks_to_rejoin_the_isr(manager):
    proposals = []

    class Recorder:
        def propose(self, partition, isr):
            proposals.append((partition.index, isr))
    manager.isr_updates = Recorder()
    lead(manager, isr=(1,), replicas=(1, 2))
    manager.append("t", 0, batch(2), now_ms=NOW)
    assert manager.get_partition("t", 0).high_watermark == 2  # the ISR is the leader alone
    manager.follower_fetched("t", 0, 2, 1, NOW + 1)
    assert proposals == []  # below the HW: not in sync yet
    manager.follower_fetched("t", 0, 2, 2, NOW + 2)
    assert proposals == [(0, frozenset({1, 2}))]
    with pytest.raises(KafkaError) as e:
        manager.follower_fetched("t", 0, 3, 0, NOW)
    assert e.value.code == E.not_leader_or_follower  # not a replica


def test_a_resent_state_older_than_the_leaders_own_isr_write_changes_nothing(manager):
    """A new controller reads the partition state, the leader's ISR shrink lands in
    ZooKeeper, then the controller's LeaderAndIsr arrives with the older ISR and version at
    the same leader epoch. Applied, it put the shrunk-out follower back into the leader's
    ISR while ZooKeeper kept it out, and the leader never proposed it again (seen in the
    copier test on three brokers: an ISR stuck at [1, 3] for good)."""
    proposals = []

    class Recorder:
        def propose(self, partition, isr):
            proposals.append(isr)
    manager.isr_updates = Recorder()
    manager.apply_partition_states([PartitionState("t", 0, 1, 5, (1, 2), (1, 2), zk_version=10)], now_ms=NOW)
    partition = manager.get_partition("t", 0)
    partition.isr_committed({1}, 11)  # the leader's own shrink, written at version 11
    assert manager.apply_partition_states([PartitionState("t", 0, 1, 5, (1, 2), (1, 2), zk_version=10)],
                                          now_ms=NOW) == {("t", 0): E.none}
    assert partition.isr == frozenset({1}) and partition.zk_version == 11
    manager.append("t", 0, batch(2), now_ms=NOW)
    manager.follower_fetched("t", 0, 2, 2, NOW + 1)
    assert proposals == [frozenset({1, 2})]  # the follower caught up: back in, through ZooKeeper
    # a newer version at the same epoch (the controller wrote it) is taken
    manager.apply_partition_states([PartitionState("t", 0, 1, 5, (1, 2), (1, 2), zk_version=12)], now_ms=NOW)
    assert partition.isr == frozenset({1, 2}) and partition.zk_version == 12


def test_a_big_leader_and_isr_is_applied_in_slices_each_partition_wholly_before_or_after(tmp_path, monkeypatch):
    """apply_in_slices lets the loop run between slices (a LeaderAndIsr for 1,000 partitions
    held it 150-425 ms of CPU, seconds of fsyncs); whenever the loop runs, each partition's
    role and the metadata cache agree, and a partition leads with its new epoch in its cache."""
    monkeypatch.setattr(replica_manager, "APPLY_SLICE", 2)
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("s", 5, {})
    metadata = MetadataCache(1, "cluster")
    manager = ReplicaManager(1, logs, metadata)
    following = [PartitionState("s", p, 2, 0, (1, 2), (1, 2)) for p in range(5)]
    metadata.update(controller_id=2, controller_epoch=1, brokers=[], partition_states=following,
                    topic_ids={"s": uuid.uuid4()})
    manager.apply_partition_states(following, now_ms=NOW)
    leading = [PartitionState("s", p, 1, 1, (1, 2), (1,)) for p in range(5)]
    seen = []

    def look():
        views = []
        for p in range(5):
            entries = logs.logs[("s", p)].leader_epoch_cache.entries
            views.append((manager.get_partition("s", p).is_leader, metadata.partition("s", p).leader == 1,
                          entries[-1] if entries else None))
        seen.append(views)

    async def scenario():
        applying = asyncio.ensure_future(manager.apply_in_slices(
            leading, NOW, lambda part, errors: metadata.update_from_leader_and_isr(part)))
        while not applying.done():
            look()
            await asyncio.sleep(0)
        return applying.result()

    assert asyncio.run(scenario()) == {("s", p): E.none for p in range(5)}
    manager.close()
    logs.close()
    assert any(0 < sum(leads for leads, _, _ in views) < 5 for views in seen)  # the loop ran between slices
    assert all(leads == listed for views in seen for leads, listed, _ in views)
    assert all(entry == (1, 0) for views in seen for leads, _, entry in views if leads)
    assert [manager.get_partition("s", p).leader_epoch for p in range(5)] == [1] * 5
