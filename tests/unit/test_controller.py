"""The controller's state machines driven against the in-memory store with explicit time."""

from __future__ import annotations

import pytest

from ottla.cluster.store import NO_LEADER, ControllerMoved, LeaderAndIsr
from ottla.controller import ControllerConfig, PartitionPhase, ReplicaPhase
from ottla.errors import ErrorCode

from .controller_sim import Sim

E = ErrorCode


def leaders(sim, topic, count):
    return [sim.state(topic, p).leader for p in range(count)]


def test_first_broker_becomes_controller_and_every_broker_hears_the_cluster():
    sim = Sim()
    controller = sim.controller()
    assert controller.broker_id == 1
    assert sim.zk.controller_epoch.epoch == 1
    for broker in sim.brokers.values():
        assert broker.live_brokers == {1, 2, 3}
        assert broker.controller_epoch == 1


def test_topic_creation_elects_first_replicas_and_spreads_leaders():
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=2)
    assert sorted(leaders(sim, "t", 3)) == [1, 2, 3]
    for p in range(3):
        state = sim.state("t", p)
        replicas = sim.zk.topics["t"].partitions[p]
        assert state.leader == replicas[0] and state.isr == replicas and state.leader_epoch == 0
        for b in replicas:
            assert sim.brokers[b].roles[("t", p)] == ("leader" if b == state.leader else "follower")
        for broker in sim.brokers.values():  # every broker knows every partition
            assert broker.metadata[("t", p)].leader == state.leader
    controller = sim.controller().controller
    assert {controller.ctx.partition_phase[("t", p)] for p in range(3)} == {PartitionPhase.ONLINE}
    assert {controller.ctx.replica_phase[r] for r in controller.ctx.replica_phase} == {ReplicaPhase.ONLINE}
    new_flags = [s.is_new for r in sim.sent if r.kind == "LeaderAndIsr" for s in r.payload.partitions]
    assert new_flags and all(new_flags)


def test_new_partitions_are_brought_online():
    sim = Sim()
    topic = sim.create_topic("t", partitions=1, replication_factor=1)
    import dataclasses
    sim.brokers[2].store.set_assignment(dataclasses.replace(topic, partitions={0: (1,), 1: (2,)}), None)
    sim.pump()
    assert sim.state("t", 1).leader == 2 and sim.brokers[2].roles[("t", 1)] == "leader"


def test_leader_broker_dies_leadership_moves_within_the_isr_with_a_new_epoch():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3, 1)})
    sim.kill(2)
    sim.pump()
    state = sim.state("t")
    assert state.leader == 3 and state.leader_epoch >= 1 and 2 not in state.isr
    assert sim.brokers[3].roles[("t", 0)] == "leader"
    assert sim.brokers[1].metadata[("t", 0)].leader == 3
    assert 2 not in sim.brokers[1].live_brokers
    assert sim.brokers[1].metadata[("t", 0)].offline_replicas == (2,)


def test_follower_broker_dies_the_leader_stays_at_a_new_epoch():
    """As Kafka's ZooKeeper controller: the follower leaves the ISR under the next leader epoch
    and the leader gets that epoch in a LeaderAndIsr, still leading. Its coordinators keep what
    they loaded then (replica_manager.py: only a new leader loads)."""
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3, 1)})
    before = sim.state("t")
    follower = next(b for b in (3, 1) if b != sim.controller().broker_id)
    sim.kill(follower)
    sim.pump()
    state = sim.state("t")
    assert (state.leader, state.leader_epoch) == (2, before.leader_epoch + 1) and follower not in state.isr
    assert sim.brokers[2].roles[("t", 0)] == "leader" and sim.brokers[2].leader_epochs[("t", 0)] == state.leader_epoch


def test_all_isr_gone_stays_offline_until_an_isr_member_returns():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.kill(3)
    sim.pump()
    assert sim.state("t").isr == (2,)
    sim.kill(2)
    sim.pump()
    state = sim.state("t")
    assert state.leader == NO_LEADER and state.isr == (2,)  # the last ISR member is kept
    assert sim.brokers[1].metadata[("t", 0)].leader == NO_LEADER
    sim.start(3)  # not in the ISR: no clean election
    sim.pump()
    assert sim.state("t").leader == NO_LEADER
    assert sim.controller().controller.ctx.partition_phase[("t", 0)] is PartitionPhase.OFFLINE
    sim.start(2)
    sim.pump()
    state = sim.state("t")
    assert state.leader == 2 and sim.brokers[2].roles[("t", 0)] == "leader"
    assert sim.brokers[3].roles[("t", 0)] == "follower"


def test_unclean_election_when_enabled_for_the_topic():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)},
                     configs={"unclean.leader.election.enable": "true"})
    sim.kill(3)
    sim.pump()
    sim.kill(2)
    sim.pump()
    sim.start(3)
    sim.pump()
    assert sim.state("t").leader == 3 and sim.state("t").isr == (3,)


def test_unclean_election_as_soon_as_an_offline_topic_enables_it():
    """Kafka's controller elects when the topic's config changes, not at the next broker change."""
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.create_topic("other", partitions=1, assignment={0: (2,)})
    sim.kill(3), sim.pump(), sim.kill(2), sim.pump(), sim.start(3), sim.pump()
    assert sim.state("t").leader == NO_LEADER
    sim.controller().store.set_topic_configs("other", {"retention.ms": "1000"})
    sim.pump()
    assert sim.state("t").leader == NO_LEADER  # another topic's change elects nothing here
    sim.controller().store.set_topic_configs("t", {"unclean.leader.election.enable": "true"})
    sim.pump()
    assert sim.state("t").leader == 3 and sim.state("t").isr == (3,)
    assert sim.brokers[3].roles[("t", 0)] == "leader"
    assert sim.state("other").leader == NO_LEADER  # its only replica is down


def test_elect_leaders_unclean_on_request():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.kill(3), sim.pump(), sim.kill(2), sim.pump(), sim.start(3), sim.pump()
    controller = sim.controller().controller
    results, requests = controller.elect_leaders([("t", 0), ("nope", 0)], "unclean", sim.now)
    sim.deliver(requests)
    assert results[("t", 0)] == (E.none, None)
    assert results[("nope", 0)][0] == E.unknown_topic_or_partition
    assert sim.state("t").leader == 3


def test_controller_failover_moves_the_epoch_and_resends_the_state():
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=3)
    before = {p: sim.state("t", p) for p in range(3)}
    sim.kill(1)
    sim.pump()
    new = sim.controller()
    assert new.broker_id in (2, 3)
    assert sim.zk.controller_epoch.epoch == 2
    for p in range(3):
        state = sim.state("t", p)
        assert state.leader != 1
        if before[p].leader != 1:
            assert state.leader == before[p].leader
    for b in (2, 3):
        assert sim.brokers[b].controller_epoch == 2 and sim.brokers[b].live_brokers == {2, 3}
    sim.create_topic("after", partitions=2, replication_factor=2)
    assert all(sim.state("after", p).leader in (2, 3) for p in range(2))


def test_a_broker_that_died_with_the_controller_leaves_every_isr():
    """The new controller never sees broker 1 die (it died with the old controller): still,
    its replicas leave the ISR at failover, as Kafka's replica state machine startup does;
    otherwise a follower with nothing to catch up on would stay in the ISR for good."""
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=3)
    assert all(1 in sim.state("t", p).isr for p in range(3))
    sim.kill(1)
    sim.pump()
    assert sim.controller().broker_id != 1
    for p in range(3):
        state = sim.state("t", p)
        assert 1 not in state.isr and state.leader in (2, 3), state
        for b in (2, 3):
            assert 1 not in sim.brokers[b].metadata[("t", p)].isr


def test_deposed_controller_cannot_write_and_its_requests_are_refused():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (1, 2, 3)})
    old = sim.brokers[1]
    # Broker 1 is paused past its session timeout: ZooKeeper expires it, it has not heard.
    old.paused = True
    sim.zk.drop_ephemerals(old.store.session_id)
    sim.zk.fire("brokers", "controller")
    sim.pump()
    new = [b for b in sim.brokers.values() if b.controller.active and b.broker_id != 1][0]
    assert sim.zk.controller_epoch.epoch == 2 and old.controller.active
    version = sim.state("t").version
    with pytest.raises(ControllerMoved):  # the store itself refuses the stale epoch
        old.store.update_partition_state(("t", 0), sim.state("t"), old.controller.epoch)
    # It wakes up and acts on the broker change it missed: its first write is refused.
    old.paused = False
    requests = old.controller.on_brokers_changed(sim.now)
    assert requests == [] and not old.controller.active
    assert sim.state("t").version == version
    # A request it built before it knew goes out with the old epoch: brokers refuse it.
    from ottla.controller.requests import RequestBatch
    batch = RequestBatch()
    batch.add_update_metadata([2, 3])
    stale = batch.build(1, 1, {b: r for b, r in sim.zk.session().live_brokers().items()}, {})
    sim.deliver(stale)
    assert len(sim.brokers[2].refused) == 1 and len(sim.brokers[3].refused) == 1
    assert new.controller.active


def test_controlled_shutdown_moves_leadership_and_leaves_the_isr():
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=3)
    sim.create_topic("single", partitions=1, assignment={0: (2,)})
    sim.create_topic("stuck", partitions=1, assignment={0: (2, 4)})  # broker 4 never started
    controller = sim.controller().controller
    led = [p for p in range(3) if sim.state("t", p).leader == 2]
    assert led
    error, remaining, requests = controller.controlled_shutdown(2, sim.brokers[2].epoch, sim.now)
    sim.deliver(requests)
    assert error == E.none
    # A replicated partition with no other live replica is still led by 2; a single replica
    # has nowhere to go and is not waited for (Kafka's replicatedPartitionsBrokerLeads).
    assert remaining == {("stuck", 0)}
    for p in range(3):
        state = sim.state("t", p)
        assert state.leader != 2 and 2 not in state.isr
        assert sim.brokers[2].roles.get(("t", p)) != "leader"
    for p in led:
        assert sim.brokers[sim.state("t", p).leader].roles[("t", p)] == "leader"
    assert controller.controlled_shutdown(2, sim.brokers[2].epoch - 1, sim.now)[0] == E.stale_broker_epoch
    assert controller.controlled_shutdown(9, -1, sim.now)[0] == E.broker_not_available
    assert sim.brokers[3].controller.controlled_shutdown(2, -1, sim.now)[0] == E.not_controller
    # The broker stops; nothing moves again; it returns and rejoins as follower.
    sim.kill(2)
    sim.pump()
    assert all(sim.state("t", p).leader != 2 for p in range(3))
    sim.start(2)
    sim.pump()
    assert all(sim.brokers[2].roles[("t", p)] == "follower" for p in range(3))


def test_deletion_while_a_broker_is_down_completes_when_it_returns():
    sim = Sim()
    sim.create_topic("t", partitions=2, replication_factor=3)
    sim.kill(3)
    sim.pump()
    sim.brokers[1].store.request_topic_deletion("t")
    sim.pump()
    assert sim.brokers[1].deleted >= {("t", 0), ("t", 1)}
    assert sim.brokers[2].deleted >= {("t", 0), ("t", 1)}
    assert "t" in sim.zk.topics and sim.zk.deletions == {"t"}  # waits for broker 3
    assert ("t", 0) not in sim.brokers[2].metadata  # nobody serves it meanwhile
    sim.start(3)
    sim.pump()
    assert sim.brokers[3].deleted >= {("t", 0), ("t", 1)}
    assert "t" not in sim.zk.topics and sim.zk.deletions == set()
    assert not any(t == "t" for t, _ in sim.zk.states)
    # The name is free again.
    sim.create_topic("t", partitions=1, replication_factor=3)
    assert sim.state("t").leader in (1, 2, 3)


def test_deletion_survives_controller_failover():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.kill(3)
    sim.pump()
    sim.brokers[2].store.request_topic_deletion("t")
    sim.pump()
    sim.kill(1)  # the controller
    sim.pump()
    assert "t" in sim.zk.topics
    sim.start(3)
    sim.pump()
    assert "t" not in sim.zk.topics and ("t", 0) in sim.brokers[3].deleted


def test_preferred_leader_election_on_request_and_automatic():
    sim = Sim(config=ControllerConfig(auto_leader_rebalance_enable=True,
                                      leader_imbalance_check_interval_ms=1000))
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.kill(2), sim.pump(), sim.start(2), sim.pump()
    assert sim.state("t").leader == 3
    controller = sim.controller().controller
    results, requests = controller.elect_leaders([("t", 0)], "preferred", sim.now)
    assert results[("t", 0)] == (E.preferred_leader_not_available, results[("t", 0)][1])
    sim.leader_writes_isr("t", 0, (3, 2))  # broker 2 caught up
    results, requests = controller.elect_leaders([("t", 0)], "preferred", sim.now)
    sim.deliver(requests)
    assert results[("t", 0)] == (E.none, None) and sim.state("t").leader == 2
    assert controller.elect_leaders([("t", 0)], "preferred", sim.now)[0][("t", 0)][0] == E.election_not_needed
    # Automatic: the leader moves away again; the check runs after 5 s, then every interval.
    sim.kill(2), sim.pump(), sim.start(2), sim.pump()
    sim.leader_writes_isr("t", 0, (3, 2))
    assert sim.state("t").leader == 3
    sim.advance(1000)
    assert sim.state("t").leader == 3
    sim.advance(5000)
    assert sim.state("t").leader == 2
    # And through /admin/preferred_replica_election.
    sim.kill(2), sim.pump(), sim.start(2), sim.pump()
    sim.leader_writes_isr("t", 0, (3, 2))
    sim.brokers[1].store.request_preferred_election({("t", 0)})
    sim.pump()
    assert sim.state("t").leader == 2 and sim.zk.preferred == set()


def test_no_automatic_rebalance_when_disabled():
    sim = Sim(config=ControllerConfig(auto_leader_rebalance_enable=False))
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    sim.kill(2), sim.pump(), sim.start(2), sim.pump()
    sim.leader_writes_isr("t", 0, (3, 2))
    sim.advance(10 * 300_000)
    assert sim.state("t").leader == 3


def test_reassignment_adds_waits_for_isr_elects_and_removes():
    sim = Sim(broker_ids=(1, 2, 3, 4))
    sim.create_topic("t", partitions=1, assignment={0: (1, 2)})
    controller = sim.controller().controller
    epoch_before = sim.state("t").leader_epoch
    results, requests = controller.alter_reassignments({("t", 0): (3, 4)}, sim.now)
    sim.deliver(requests)
    assert results[("t", 0)] == (E.none, None)
    assignment = sim.zk.topics["t"]
    assert assignment.partitions[0] == (3, 4, 1, 2)
    assert assignment.adding_replicas[0] == (3, 4) and assignment.removing_replicas[0] == (1, 2)
    assert controller.list_reassignments() == {("t", 0): ((3, 4, 1, 2), (3, 4), (1, 2))}
    assert sim.state("t").leader == 1 and sim.state("t").leader_epoch == epoch_before + 1
    assert sim.brokers[3].roles[("t", 0)] == "follower" and sim.brokers[4].roles[("t", 0)] == "follower"
    sim.leader_writes_isr("t", 0, (1, 2, 3))
    assert sim.zk.topics["t"].partitions[0] == (3, 4, 1, 2)  # 4 not in the ISR yet
    sim.leader_writes_isr("t", 0, (1, 2, 3, 4))
    assert sim.zk.topics["t"].partitions[0] == (3, 4) and sim.zk.topics["t"].adding_replicas == {}
    state = sim.state("t")
    assert state.leader == 3 and set(state.isr) == {3, 4}
    assert ("t", 0) in sim.brokers[1].deleted and ("t", 0) in sim.brokers[2].deleted
    assert controller.list_reassignments() == {}
    assert sim.brokers[4].metadata[("t", 0)].replicas == (3, 4)


def test_reassignment_validation_and_cancel():
    sim = Sim(broker_ids=(1, 2, 3))
    sim.create_topic("t", partitions=1, assignment={0: (1,)})
    controller = sim.controller().controller
    bad, _ = controller.alter_reassignments({("t", 0): (), ("t", 9): (1,), ("t", 0 + 0): ()}, sim.now)
    assert bad[("t", 0)][0] == E.invalid_replica_assignment
    assert bad[("t", 9)][0] == E.unknown_topic_or_partition
    assert controller.alter_reassignments({("t", 0): (1, 1)}, sim.now)[0][("t", 0)][0] == E.invalid_replica_assignment
    assert controller.alter_reassignments({("t", 0): (7,)}, sim.now)[0][("t", 0)][0] == E.invalid_replica_assignment
    assert controller.alter_reassignments({("t", 0): None}, sim.now)[0][("t", 0)][0] == E.no_reassignment_in_progress
    results, requests = controller.alter_reassignments({("t", 0): (2,)}, sim.now)
    sim.deliver(requests)
    assert sim.zk.topics["t"].partitions[0] == (2, 1)
    results, requests = controller.alter_reassignments({("t", 0): None}, sim.now)
    sim.deliver(requests)
    assert results[("t", 0)] == (E.none, None)
    assert sim.zk.topics["t"].partitions[0] == (1,) and controller.list_reassignments() == {}
    assert ("t", 0) in sim.brokers[2].deleted and sim.state("t").leader == 1


def test_reassignment_through_the_store_request():
    sim = Sim(broker_ids=(1, 2))
    sim.create_topic("t", partitions=1, assignment={0: (1,)})
    sim.brokers[2].store.request_reassignment({("t", 0): (2,)})
    sim.pump()
    sim.leader_writes_isr("t", 0, (1, 2))
    assert sim.zk.topics["t"].partitions[0] == (2,) and sim.state("t").leader == 2
    assert sim.zk.reassignment == {}


def test_isr_change_notifications_reach_every_broker():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (1, 2, 3)})
    sim.leader_writes_isr("t", 0, (1, 2))
    for broker in sim.brokers.values():
        assert broker.metadata[("t", 0)].isr == (1, 2)
    # The controller's next election starts from the version the leader wrote.
    sim.kill(1)
    sim.pump()
    assert sim.state("t").leader == 2 and sim.state("t").isr == (2,)


def test_isr_changes_of_many_partitions_cost_one_read_of_the_topic(monkeypatch):
    """A broker back in the ISR of every partition announces one change per partition; the
    controller re-reads the topic's states once for all of them. (Once per change, a 1,000-partition
    topic cost a million znode reads and the brokers' metadata did not show the ISR for minutes.)"""
    from ottla.cluster.store import LeaderAndIsr

    sim = Sim()
    sim.create_topic("t", partitions=30, replication_factor=3)
    for p in range(30):
        state = sim.state("t", p)
        store = sim.brokers[state.leader].store
        store.update_partition_state(("t", p), LeaderAndIsr(state.leader, state.leader_epoch, (state.leader,),
                                                             state.controller_epoch, state.version), None)
        store.notify_isr_change({("t", p)})
    store = sim.controller().store
    reads = []
    real = store.partition_states
    monkeypatch.setattr(store, "partition_states", lambda topic: reads.append(topic) or real(topic))
    sim.pump()
    assert reads == ["t"]
    for broker in sim.brokers.values():
        assert [broker.metadata[("t", p)].isr for p in range(30)] == [(sim.state("t", p).leader,) for p in range(30)]


def test_bounced_broker_is_treated_as_failed_then_started():
    sim = Sim()
    sim.create_topic("t", partitions=1, assignment={0: (2, 3)})
    # Broker 2 restarts faster than the controller hears: one watch sees a new epoch.
    events_before = len(sim.events)
    sim.brokers[2].store.close()
    sim.brokers[2].up = False
    sim.events.clear()
    sim.start(2)
    sim.pump()
    assert events_before == 0
    state = sim.state("t")
    assert state.leader == 3 and sim.brokers[2].roles[("t", 0)] == "follower"


def test_broker_failure_writes_all_partition_states_in_one_batch_and_one_request_per_broker():
    """Kafka's controller pipelines its partition-state writes (updateLeaderAndIsr): a broker
    failure must not cost one store round trip per partition, and each broker hears each
    step's changes in one request, not one per partition."""
    sim = Sim()
    sim.create_topic("t", partitions=30, replication_factor=3)
    controller = sim.controller()
    store = controller.store
    single, batches = [], []
    original_one, original_many = store.update_partition_state, store.update_partition_states
    store.update_partition_state = lambda *a, **k: single.append(a[0]) or original_one(*a, **k)
    store.update_partition_states = lambda *a, **k: batches.append(sorted(a[0])) or original_many(*a, **k)
    victim = next(b for b in (1, 2, 3) if b != controller.broker_id)
    led = [p for p in range(30) if sim.state("t", p).leader == victim]
    sim.sent.clear()
    sim.kill(victim)
    sim.pump()
    assert single == []
    assert batches == [[("t", p) for p in led], [("t", p) for p in range(30) if p not in led]]
    for p in range(30):
        assert sim.state("t", p).leader not in (victim, NO_LEADER) and victim not in sim.state("t", p).isr
    # Kafka's batching, one request per broker and kind per state-machine step: the first
    # LeaderAndIsr each survivor gets carries every election.
    for broker_id in set(sim.brokers) - {victim}:
        first = next(r for r in sim.sent if r.kind == "LeaderAndIsr" and r.destination == broker_id)
        assert sorted(s.partition for s in first.payload.partitions) == led
    assert len([r for r in sim.sent if r.kind == "LeaderAndIsr"]) <= 2 * 2  # two steps, two survivors


def test_a_stale_version_refuses_only_its_own_partition_and_that_one_is_elected_again():
    sim = Sim()
    sim.create_topic("t", partitions=6, replication_factor=3)
    controller = sim.controller()
    victim = next(b for b in (1, 2, 3) if b != controller.broker_id)
    led = [p for p in range(6) if sim.state("t", p).leader == victim]
    raced = ("t", led[0])
    store, original = controller.store, controller.store.update_partition_states
    calls = []

    def leader_shrinks_isr_first(states, epoch):
        if not calls:  # the old leader's ISR write lands just before the election's writes
            state = sim.state(*raced)
            sim.zk.session().update_partition_state(raced, LeaderAndIsr(
                state.leader, state.leader_epoch, state.isr[:2], state.controller_epoch, state.version), None)
        calls.append(sorted(states))
        return original(states, epoch)
    store.update_partition_states = leader_shrinks_isr_first
    sim.kill(victim)
    sim.pump()
    assert calls[0] == [("t", p) for p in led] and calls[1] == [raced]  # only the refused one again
    for p in range(6):
        assert sim.state("t", p).leader not in (victim, NO_LEADER)


def _kinds_from(broker, controller_epoch: int) -> list[str]:
    return [r.kind for r in broker.received if r.payload.controller_epoch == controller_epoch]


def test_after_failover_every_broker_hears_the_cluster_before_its_roles():
    """Kafka's order (onControllerFailover sends UpdateMetadata before the state machines
    start): a broker whose coordinator loads on LeaderAndIsr must already know the cluster's
    topics, or it takes the partitions of a prepared transaction for deleted ones and
    completes the transaction without writing their markers."""
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=3)
    sim.kill(1)
    sim.pump()
    epoch = sim.zk.controller_epoch.epoch
    for b in (2, 3):
        kinds = _kinds_from(sim.brokers[b], epoch)
        assert "LeaderAndIsr" in kinds and kinds.index("UpdateMetadata") < kinds.index("LeaderAndIsr"), kinds


def test_a_restarted_broker_hears_the_cluster_before_its_roles():
    """Kafka's onBrokerStartup: UpdateMetadata to the new broker first, then its replicas go
    online (LeaderAndIsr). Broker 2 restarts faster than the controller hears it died."""
    sim = Sim()
    sim.create_topic("t", partitions=3, replication_factor=3)
    sim.brokers[2].store.close()
    sim.brokers[2].up = False
    restarted = sim.start(2)
    sim.pump()
    kinds = [r.kind for r in restarted.received]
    assert "LeaderAndIsr" in kinds and kinds.index("UpdateMetadata") < kinds.index("LeaderAndIsr"), kinds
    assert ("t", 0) in restarted.metadata


def test_reassignment_may_forbid_a_replication_factor_change():
    """AlterPartitionReassignments v1 (KIP-860): with allow_replication_factor_change false a
    target of another size is INVALID_REPLICATION_FACTOR, measured against the set an ongoing
    reassignment is headed for; the same size is accepted."""
    sim = Sim(broker_ids=(1, 2, 3, 4))
    sim.create_topic("t", partitions=2, assignment={0: (1, 2), 1: (1, 2)})
    controller = sim.controller().controller
    refused, _ = controller.alter_reassignments({("t", 0): (1, 2, 3), ("t", 1): (3,)}, sim.now, allow_rf_change=False)
    assert refused == {("t", 0): (E.invalid_replication_factor, "The replication factor is changed from 2 to 3"),
                       ("t", 1): (E.invalid_replication_factor, "The replication factor is changed from 2 to 1")}
    assert sim.zk.topics["t"].partitions[0] == (1, 2)
    results, requests = controller.alter_reassignments({("t", 0): (3, 4)}, sim.now, allow_rf_change=False)
    sim.deliver(requests)
    assert results[("t", 0)] == (E.none, None)
    assert sim.zk.topics["t"].partitions[0] == (3, 4, 1, 2)  # under way: headed for two replicas
    assert controller.alter_reassignments({("t", 0): (2, 3, 4)}, sim.now, allow_rf_change=False)[0][("t", 0)] == \
        (E.invalid_replication_factor, "The replication factor is changed from 2 to 3")
    results, requests = controller.alter_reassignments({("t", 0): (2, 3, 4)}, sim.now)  # allowed by default (v0)
    assert results[("t", 0)] == (E.none, None)
