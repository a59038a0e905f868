"""The in-memory ClusterStore keeps ZooKeeper's semantics the controller relies on."""

from __future__ import annotations

import uuid

import pytest

from ottla.cluster.memory_store import MemoryZooKeeper
from ottla.cluster.store import (
    BrokerIdInUse,
    BrokerRegistration,
    ControllerMoved,
    LeaderAndIsr,
    StaleVersion,
    StoreUnavailable,
    TopicAssignment,
    TopicExists,
)


def topic(name="t", partitions=None):
    return TopicAssignment(name, uuid.uuid4(), partitions or {0: (1, 2)})


def test_ephemeral_registration_vanishes_with_the_session_and_watches_fire():
    zk = MemoryZooKeeper()
    a, b = zk.session(), zk.session()
    fired = []
    b.watch("brokers", lambda: fired.append("brokers"))
    lost = []
    a.on_session_lost(lambda: lost.append(True))
    reg = a.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
    assert reg.epoch > 0
    with pytest.raises(BrokerIdInUse):
        b.register_broker(BrokerRegistration(1, "127.0.0.1", 9093))
    assert fired == ["brokers"]
    a.expire_session()
    assert lost == [True]
    assert b.live_brokers() == {}
    assert fired == ["brokers", "brokers"]
    again = a.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
    assert again.epoch > reg.epoch  # a new incarnation has a new broker epoch


def test_controller_election_bumps_epoch_and_fences_the_deposed_controller():
    zk = MemoryZooKeeper()
    a, b = zk.session(), zk.session()
    first = a.elect_controller(1)
    assert (first.epoch, first.version) == (1, 1)
    assert b.elect_controller(2) is None
    a.create_topic(topic(), {})
    created = a.create_partition_states({("t", 0): LeaderAndIsr(1, 0, (1, 2), first.epoch)}, first)
    a.expire_session()  # the controller's session ends: /controller is gone
    assert b.controller_id() is None
    second = b.elect_controller(2)
    assert second.epoch == 2 and b.controller_id() == 2
    state = created[("t", 0)]
    with pytest.raises(ControllerMoved):
        a.update_partition_state(("t", 0), LeaderAndIsr(1, 1, (1,), first.epoch, state.version), first)
    with pytest.raises(ControllerMoved):
        a.complete_topic_deletion("t", first)
    assert b.partition_states("t")[0].leader_epoch == 0
    updated = b.update_partition_state(("t", 0), LeaderAndIsr(2, 1, (2,), second.epoch, state.version), second)
    assert updated.version == state.version + 1


def test_partition_state_updates_are_conditional_on_the_version():
    zk = MemoryZooKeeper()
    s = zk.session()
    epoch = s.elect_controller(1)
    s.create_topic(topic(), {})
    state = s.create_partition_states({("t", 0): LeaderAndIsr(1, 0, (1, 2), 1)}, epoch)[("t", 0)]
    leader_write = s.update_partition_state(("t", 0), LeaderAndIsr(1, 0, (1,), 1, state.version), None)
    with pytest.raises(StaleVersion):
        s.update_partition_state(("t", 0), LeaderAndIsr(2, 1, (2,), 1, state.version), epoch)
    assert s.partition_states("t")[0] == leader_write
    with pytest.raises(StaleVersion):
        s.create_partition_states({("t", 0): LeaderAndIsr(1, 0, (1,), 1)}, epoch)


def test_topic_lifecycle_and_notifications():
    zk = MemoryZooKeeper()
    s = zk.session()
    epoch = s.elect_controller(1)
    seen = []
    for target in ("topics", "topic_deletions", "isr_changes", "partition_reassignment",
                   "preferred_replica_election"):
        s.watch(target, lambda target=target: seen.append(target))
    s.create_topic(topic(), {"retention.ms": "1000"})
    with pytest.raises(TopicExists):
        s.create_topic(topic(), {})
    s.request_topic_deletion("t")
    with pytest.raises(TopicExists):  # still being deleted
        s.create_topic(topic(), {})
    assert s.topics_to_delete() == {"t"}
    s.complete_topic_deletion("t", epoch)
    assert s.topics() == {} and s.topics_to_delete() == set() and s.topic_configs("t") == {}
    s.notify_isr_change({("a", 0)})
    s.notify_isr_change({("b", 1)})
    assert s.take_isr_changes() == {("a", 0), ("b", 1)}
    assert s.take_isr_changes() == set()
    s.request_reassignment({("a", 0): (2, 3)})
    s.clear_reassignment({("a", 0)}, epoch)
    s.request_preferred_election({("a", 0)})
    assert s.preferred_election_request() == {("a", 0)}
    s.clear_preferred_election(epoch)
    assert seen == ["topics", "topic_deletions", "topics", "topic_deletions", "isr_changes",
                    "isr_changes", "isr_changes", "partition_reassignment",
                    "partition_reassignment", "preferred_replica_election",
                    "preferred_replica_election"]


def test_producer_id_blocks_never_overlap_and_closed_store_refuses():
    zk = MemoryZooKeeper()
    a, b = zk.session(), zk.session()
    assert a.claim_producer_id_block(1, 1000) == (0, 999)
    assert b.claim_producer_id_block(2, 1000) == (1000, 1999)
    a.register_broker(BrokerRegistration(1, "h", 1))
    a.elect_controller(1)
    a.close()
    assert b.live_brokers() == {} and b.controller_id() is None
    with pytest.raises(StoreUnavailable):
        a.topics()


def test_config_changes_are_numbered_notifications_as_in_zookeeper():
    zk = MemoryZooKeeper()
    s, other = zk.session(), zk.session()
    fired = []
    other.watch("config_changes", lambda: fired.append(1))
    s.create_topic(topic(), {})
    s.set_topic_configs("t", {"retention.ms": "5"})
    s.set_broker_configs(None, {"message.max.bytes": "9"})
    s.set_broker_configs(2, {})
    changes = other.config_changes(-1)
    assert [path for _, path in changes] == ["topics/t", "brokers/<default>", "brokers/2"]
    assert other.config_changes(changes[1][0]) == changes[2:]
    assert len(fired) == 3 and other.topic_configs("t") == {"retention.ms": "5"}
    other.purge_config_changes(0)  # nothing that old
    assert other.config_changes(-1) == changes
    other.purge_config_changes(2**62)
    assert other.config_changes(-1) == []
    s.set_broker_configs(1, {})
    assert other.config_changes(-1) == [(changes[-1][0] + 1, "brokers/1")]  # numbering goes on


def test_batched_partition_state_updates_refuse_each_stale_version_on_its_own():
    zk = MemoryZooKeeper()
    s = zk.session()
    epoch = s.elect_controller(1)
    s.create_topic(topic(partitions={0: (1, 2), 1: (1, 2), 2: (1, 2)}), {})
    states = s.create_partition_states({("t", p): LeaderAndIsr(1, 0, (1, 2), 1) for p in range(3)}, epoch)
    s.update_partition_state(("t", 1), LeaderAndIsr(1, 0, (1,), 1, states[("t", 1)].version), None)
    written = s.update_partition_states({("t", p): LeaderAndIsr(2, 1, (2,), 1, states[("t", p)].version)
                                         for p in range(3)}, epoch)
    assert isinstance(written[("t", 1)], StaleVersion)
    assert s.partition_states("t")[1].isr == (1,)
    for p in (0, 2):
        assert written[("t", p)] == s.partition_states("t")[p] and written[("t", p)].leader == 2
    s.resign_controller(1)
    assert zk.session().elect_controller(2).epoch == 2  # the first controller is deposed
    with pytest.raises(ControllerMoved):
        s.update_partition_states({("t", 0): LeaderAndIsr(1, 2, (1,), 1, written[("t", 0)].version)}, epoch)
    assert s.partition_states("t")[0] == written[("t", 0)]
