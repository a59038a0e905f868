"""The metadata cache: UpdateMetadata semantics (epoch fencing, full and incremental updates,
deletion) and the single-node fill."""

import uuid

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.server.metadata_cache import LEADER_DURING_DELETE, BrokerInfo, MetadataCache, PartitionState

A, B = uuid.UUID(int=1), uuid.UUID(int=2)
BROKERS = [BrokerInfo(1, "h1", 9091), BrokerInfo(2, "h2", 9092, "rack-b")]


def state(topic, partition, leader, epoch=0, replicas=(1, 2), isr=(1, 2)):
    return PartitionState(topic, partition, leader, epoch, replicas, isr)


def test_full_then_incremental_updates():
    cache = MetadataCache(1, "c")
    cache.update(controller_id=2, controller_epoch=3, brokers=BROKERS, full=True,
                 partition_states=[state("a", 0, 1), state("a", 1, 2), state("b", 0, 2)], topic_ids={"a": A, "b": B})
    assert (cache.controller_id, cache.controller_epoch) == (2, 3)
    assert cache.topic_names() == ["a", "b"] and cache.topic("a").partition_count == 2
    assert cache.topic_by_id(B).name == "b"
    assert cache.leader("a", 1) == BrokerInfo(2, "h2", 9092, "rack-b")
    assert cache.check_leader("a", 0).leader == 1
    with pytest.raises(KafkaError) as e:
        cache.check_leader("a", 1)
    assert e.value.code == ErrorCode.not_leader_or_follower
    with pytest.raises(KafkaError) as e:
        cache.check_leader("a", 7)
    assert e.value.code == ErrorCode.unknown_topic_or_partition

    # incremental: only the named partition changes; a broker gone makes its partitions leaderless
    cache.update(controller_id=2, controller_epoch=3, brokers=BROKERS[:1],
                 partition_states=[state("a", 1, 1, epoch=1, isr=(1,))], topic_ids={})
    assert cache.partition("a", 1).leader_epoch == 1 and cache.partition("a", 1).isr == (1,)
    assert cache.partition("b", 0).leader == 2 and cache.leader("b", 0) is None
    assert cache.alive_leader(cache.partition("b", 0)) == -1  # clients are told: no leader
    assert cache.alive_leader(cache.partition("a", 1)) == 1

    # deletion of every partition removes the topic (and its id)
    deleted = cache.update(controller_id=2, controller_epoch=3, brokers=BROKERS,
                           partition_states=[state("b", 0, LEADER_DURING_DELETE)], topic_ids={})
    assert deleted == ["b"] and cache.topic("b") is None and cache.topic_by_id(B) is None

    # a full update drops what it does not name
    assert cache.update(controller_id=1, controller_epoch=4, brokers=BROKERS, full=True,
                        partition_states=[state("b", 0, 2)], topic_ids={"b": B}) == ["a"]


def test_an_older_controller_epoch_is_refused_and_changes_nothing():
    cache = MetadataCache(1, "c")
    cache.update(controller_id=2, controller_epoch=5, brokers=BROKERS, partition_states=[state("a", 0, 1)],
                 topic_ids={"a": A}, full=True)
    with pytest.raises(KafkaError) as e:
        cache.update(controller_id=1, controller_epoch=4, brokers=[], partition_states=[], topic_ids={}, full=True)
    assert e.value.code == ErrorCode.stale_controller_epoch
    assert cache.controller_id == 2 and cache.topic_names() == ["a"] and len(cache.brokers) == 2


def test_a_recreated_topic_gets_its_new_id():
    cache = MetadataCache(1, "c")
    cache.update(controller_id=1, controller_epoch=0, brokers=BROKERS, partition_states=[state("a", 0, 1)],
                 topic_ids={"a": A})
    cache.update(controller_id=1, controller_epoch=0, brokers=BROKERS, partition_states=[state("a", 0, 1)],
                 topic_ids={"a": B})
    assert cache.topic("a").topic_id == B and cache.topic_by_id(A) is None


def test_single_node_fill():
    cache = MetadataCache(4, "c")
    cache.local_update(BrokerInfo(4, "localhost", 9092), [("a", A, 3)])
    assert cache.controller_id == 4 and [b.node_id for b in cache.brokers] == [4]
    assert [(p.leader, p.leader_epoch, p.replicas, p.isr) for p in cache.topic("a").partitions.values()] == [
        (4, 0, (4,), (4,))] * 3
    assert cache.local_update(BrokerInfo(4, "localhost", 9092), []) == ["a"]


def test_leader_and_isr_moves_the_leader_before_update_metadata_comes():
    """A broker that stopped leading must not keep naming itself leader in Metadata."""
    cache = MetadataCache(1, "c")
    offline = PartitionState("a", 0, 1, 0, (1, 2, 3), (1, 2), offline_replicas=(3,))
    cache.update(controller_id=2, controller_epoch=3, brokers=BROKERS, full=True,
                 partition_states=[offline, state("a", 1, 1, epoch=4)], topic_ids={"a": A})
    cache.update_from_leader_and_isr([state("a", 0, 2, epoch=1, replicas=(1, 2, 3), isr=(2,)),
                                      state("a", 1, 2, epoch=3),      # older than the cache's: ignored
                                      state("unknown", 0, 2, epoch=1)])  # no topic id yet: ignored
    assert cache.partition("a", 0) == PartitionState("a", 0, 2, 1, (1, 2, 3), (2,), offline_replicas=(3,))
    assert cache.partition("a", 1).leader == 1 and not cache.has_topic("unknown")
    with pytest.raises(KafkaError):
        cache.check_leader("a", 0)
