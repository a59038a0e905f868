"""Replica assignment: Kafka's AdminUtils.assignReplicasToBrokers examples, and validation codes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from ottla.cluster.store import BrokerRegistration
from ottla.controller.assignment import assign_replicas, rack_alternated, validate_assignment
from ottla.errors import ErrorCode, KafkaError


def brokers(*ids, racks=None):
    return [BrokerRegistration(i, "h", 1, (racks or {}).get(i)) for i in ids]


def test_rack_unaware_matches_kafkas_documented_layout():
    result = assign_replicas(brokers(0, 1, 2, 3, 4), 10, 3, start_index=0)
    # AdminUtils' comment: first replicas round robin, followers shifted, shift grows per round.
    assert result[0] == (0, 1, 2)
    assert result[4] == (4, 0, 1)
    assert result[5] == (0, 2, 3)
    assert result[9] == (4, 1, 2)
    leaders = Counter(r[0] for r in result.values())
    assert set(leaders.values()) == {2}
    replicas = Counter(b for r in result.values() for b in r)
    assert set(replicas.values()) == {6}


def test_rack_aware_matches_kafkas_documented_layout():
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    result = assign_replicas(brokers(*racks, racks=racks), 7, 3, start_index=0)
    assert [result[p] for p in range(6)] == [(0, 3, 1), (3, 1, 5), (1, 5, 4), (5, 4, 2), (4, 2, 0), (2, 0, 3)]
    assert result[6] == (0, 4, 2)
    for replicas in result.values():
        assert len({racks[b] for b in replicas}) == 3


def test_random_start_spreads_leaders_and_never_repeats_a_broker():
    result = assign_replicas(brokers(1, 2, 3), 6, 3, rng=random.Random(7))
    assert Counter(r[0] for r in result.values()) == {1: 2, 2: 2, 3: 2}
    assert all(len(set(r)) == 3 for r in result.values())


def test_added_partitions_continue_the_numbering():
    result = assign_replicas(brokers(1, 2, 3), 2, 2, start_index=0, start_partition=3)
    assert sorted(result) == [3, 4]


@pytest.mark.parametrize("args, code", [
    ((brokers(1, 2, 3), 3, 4), ErrorCode.invalid_replication_factor),
    ((brokers(1, 2, 3), 3, 0), ErrorCode.invalid_replication_factor),
    ((brokers(1, 2, 3), 0, 1), ErrorCode.invalid_partitions),
    ((brokers(1, 2, racks={1: "a"}), 1, 1), ErrorCode.invalid_replica_assignment),
])
def test_assignment_errors(args, code):
    with pytest.raises(KafkaError) as info:
        assign_replicas(*args)
    assert info.value.code == code


@pytest.mark.parametrize("assignment", [
    {0: (1, 9)},            # unknown broker
    {0: (1, 1)},            # a broker twice
    {0: ()},                # empty
    {0: (1,), 2: (2,)},     # gap
    {0: (1, 2), 1: (3,)},   # inconsistent replication factor
])
def test_explicit_assignment_validation(assignment):
    with pytest.raises(KafkaError) as info:
        validate_assignment(assignment, {1, 2, 3})
    assert info.value.code == ErrorCode.invalid_replica_assignment


def test_explicit_assignment_accepted_and_checked_against_existing_factor():
    validate_assignment({0: (1, 2), 1: (2, 3)}, {1, 2, 3})
    validate_assignment({2: (3, 1)}, {1, 2, 3}, first_partition=2, replication_factor=2)
    with pytest.raises(KafkaError):
        validate_assignment({2: (3,)}, {1, 2, 3}, first_partition=2, replication_factor=2)
