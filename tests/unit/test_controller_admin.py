"""Topic admin through the store from any broker, with the controller acting on it."""

from __future__ import annotations

import random

import pytest

from ottla.controller import admin
from ottla.errors import ErrorCode, KafkaError

from .controller_sim import Sim

E = ErrorCode


def code_of(call, *args, **kwargs):
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    return info.value.code


def test_create_from_a_non_controller_broker_lands_everywhere():
    sim = Sim()
    store = sim.brokers[3].store
    planned = admin.plan_topic(store, "t", 6, 2, rng=random.Random(1))
    admin.create_topic(store, planned, {"retention.ms": 1000})
    sim.pump()
    assert sorted(sim.state("t", p).leader for p in range(6)) == [1, 1, 2, 2, 3, 3]
    assert all(("t", 5) in b.metadata for b in sim.brokers.values())
    assert sim.zk.topic_configs["t"] == {"retention.ms": "1000"}
    assert code_of(admin.plan_topic, store, "t", 1, 1) == E.topic_already_exists
    assert code_of(admin.create_topic, store, planned, {}) == E.topic_already_exists


def test_create_rejects_bad_assignments_and_factors_with_kafkas_codes():
    sim = Sim()
    store = sim.brokers[1].store
    assert code_of(admin.plan_topic, store, "t", 1, 4) == E.invalid_replication_factor
    assert code_of(admin.plan_topic, store, "t", -1, -1, {0: (1, 7)}) == E.invalid_replica_assignment
    assert sim.zk.topics == {}  # nothing half-created


def test_create_partitions_follows_the_existing_factor():
    sim = Sim()
    store = sim.brokers[2].store
    admin.create_topic(store, admin.plan_topic(store, "t", 2, 2), {})
    sim.pump()
    assert code_of(admin.create_partitions, store, "t", 2) == E.invalid_partitions
    assert code_of(admin.create_partitions, store, "t", 1) == E.invalid_partitions
    assert code_of(admin.create_partitions, store, "nope", 3) == E.unknown_topic_or_partition
    assert code_of(admin.create_partitions, store, "t", 4, [(1, 2)]) == E.invalid_replica_assignment
    assert code_of(admin.create_partitions, store, "t", 3, [(1,)]) == E.invalid_replica_assignment
    assert code_of(admin.create_partitions, store, "t", 3, [(1, 9)]) == E.invalid_replica_assignment
    admin.create_partitions(store, "t", 3, validate_only=True)
    assert len(sim.zk.topics["t"].partitions) == 2
    admin.create_partitions(store, "t", 4)
    sim.pump()
    assert [len(sim.zk.topics["t"].partitions[p]) for p in range(4)] == [2, 2, 2, 2]
    assert all(sim.state("t", p).leader in (1, 2, 3) for p in (2, 3))


def test_delete_topic():
    sim = Sim()
    store = sim.brokers[2].store
    admin.create_topic(store, admin.plan_topic(store, "t", 1, 3), {})
    sim.pump()
    assert code_of(admin.delete_topic, store, "nope") == E.unknown_topic_or_partition
    admin.delete_topic(store, "t")
    sim.pump()
    assert "t" not in sim.zk.topics
    assert all(("t", 0) in b.deleted for b in sim.brokers.values())
