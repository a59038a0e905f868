"""ZkClusterStore against a real ZooKeeper (Debian's jars, started by ottla.testing.zookeeper).

Each test works under a chroot of its own, so one server serves the module; the tests that
break ZooKeeper itself start their own.
"""

from __future__ import annotations

from functools import partial
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from kazoo.client import KazooClient

from ottla.cluster.store import (NO_LEADER, BrokerIdInUse, BrokerRegistration, ControllerMoved, LeaderAndIsr,
                                 NoSuchTopic, StaleVersion, StoreUnavailable, TopicAssignment, TopicExists)
from ottla.cluster.zk import ZkClusterStore, ZkProducerIdBlockStore
from ottla.cluster.zk_data import topic_id_to_str
from ottla.producer_state.allocator import ProducerIdManager
from ottla.testing.zookeeper import free_port, zookeeper, zookeeper_ensemble
from tests.waiting import wait_for as _wait_for

SESSION_MS = 4000


@pytest.fixture(scope="module")
def zk_server():
    with zookeeper() as server:
        yield server


@pytest.fixture
def raw(zk_server, zk_client):
    return zk_client(zk_server.connect)


@pytest.fixture
def connect(zk_server, raw):
    """A fresh chroot per test: "127.0.0.1:PORT/test-<uuid>"."""
    chroot = f"/test-{uuid.uuid4().hex[:8]}"
    raw.create(chroot)
    return f"{zk_server.connect}{chroot}"


@pytest.fixture
def stores(connect):
    opened = []

    def open_store(**kwargs) -> ZkClusterStore:
        store = ZkClusterStore(connect, session_timeout_ms=kwargs.pop("session_timeout_ms", SESSION_MS), **kwargs)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


wait_for = partial(_wait_for, timeout=30.0, interval=0.05)


def read_json(raw, path):
    return json.loads(raw.get(path)[0])


def test_kafka_layout_inside_the_chroot(stores, connect, raw):
    store = stores()
    chroot = connect.partition("/")[2]
    for path in ("brokers/ids", "brokers/topics", "config/changes", "config/topics", "config/brokers",
                 "admin/delete_topics", "isr_change_notification", "latest_producer_id_block"):
        assert raw.exists(f"/{chroot}/{path}"), path
    assert not raw.exists("/brokers")  # nothing outside the chroot
    assert store.cluster_id("first-id") == "first-id"
    assert stores().cluster_id("second-id") == "first-id"
    assert read_json(raw, f"/{chroot}/cluster/id") == {"version": "1", "id": "first-id"}


def test_broker_registration_is_ephemeral_and_unique(stores, connect, raw):
    chroot = connect.partition("/")[2]
    one, two = stores(), stores()
    reg = one.register_broker(BrokerRegistration(1, "127.0.0.1", 9092, rack="r1"))
    assert reg.epoch > 0
    data = read_json(raw, f"/{chroot}/brokers/ids/1")
    assert data["version"] == 5 and data["endpoints"] == ["PLAINTEXT://127.0.0.1:9092"]
    assert data["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
    assert data["rack"] == "r1" and data["host"] == "127.0.0.1" and data["port"] == 9092
    assert int(data["timestamp"]) > 0
    with pytest.raises(BrokerIdInUse):
        two.register_broker(BrokerRegistration(1, "127.0.0.1", 9093))
    two.register_broker(BrokerRegistration(2, "127.0.0.1", 9093))
    assert two.live_brokers() == {1: reg, 2: two.live_brokers()[2]}
    assert two.live_brokers()[2].epoch > reg.epoch

    changed, lost = threading.Event(), threading.Event()
    two.watch("brokers", changed.set)
    one.on_session_lost(lost.set)
    one.close()  # session closed: the ephemeral registration goes at once
    assert changed.wait(30)
    assert set(two.live_brokers()) == {2}
    assert not lost.is_set()  # closing is not losing the session


def test_controller_race_one_wins_and_the_deposed_is_fenced(stores, connect, raw):
    chroot = connect.partition("/")[2]
    contenders = [stores() for _ in range(4)]
    results = [None] * 4
    barrier = threading.Barrier(4)

    def run(i):
        barrier.wait()
        results[i] = contenders[i].elect_controller(i + 1)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1
    winner = winners[0]
    first_epoch = results[winner]
    assert first_epoch.epoch == 1
    assert raw.get(f"/{chroot}/controller_epoch")[0] == b"1"
    controller = read_json(raw, f"/{chroot}/controller")
    assert controller["version"] == 1 and controller["brokerid"] == winner + 1 and int(controller["timestamp"]) > 0
    assert contenders[0].controller_id() == winner + 1

    topic = TopicAssignment("t", uuid.uuid4(), {0: (1, 2)})
    contenders[winner].create_topic(topic, {})
    created = contenders[winner].create_partition_states({("t", 0): LeaderAndIsr(1, 0, (1, 2), 1)}, first_epoch)
    state = created[("t", 0)]
    assert state.version == 0

    # The controller's session ends (kill -9 of its broker): someone else takes over.
    moved = threading.Event()
    seen_in_callback = []
    other = contenders[(winner + 1) % 4]

    def controller_changed():  # a callback may read the store (on the store's thread)
        seen_in_callback.append(other.controller_id())
        moved.set()
    other.watch("controller", controller_changed)
    contenders[winner].close()
    assert moved.wait(30)
    assert seen_in_callback[0] is None and other.controller_id() is None
    second_epoch = other.elect_controller(9)
    assert second_epoch.epoch == 2 and second_epoch.version > first_epoch.version
    assert other.controller_epoch() == second_epoch

    deposed = contenders[(winner + 2) % 4]  # any client still holding the old epoch
    with pytest.raises(ControllerMoved):
        deposed.update_partition_state(("t", 0), LeaderAndIsr(2, 1, (2,), 1, state.version), first_epoch)
    with pytest.raises(ControllerMoved):
        deposed.set_assignment(TopicAssignment("t", topic.topic_id, {0: (2, 1)}), first_epoch)
    with pytest.raises(ControllerMoved):
        deposed.complete_topic_deletion("t", first_epoch)
    assert other.partition_states("t") == {0: state}
    updated = other.update_partition_state(("t", 0), LeaderAndIsr(2, 1, (2,), 2, state.version), second_epoch)
    assert updated.version == 1


def test_partition_state_updates_are_conditional(stores, connect, raw):
    chroot = connect.partition("/")[2]
    store = stores()
    epoch = store.elect_controller(1)
    tid = uuid.uuid4()
    store.create_topic(TopicAssignment("orders", tid, {0: (1, 2, 3), 1: (2, 3, 1)}), {"cleanup.policy": "compact"})
    assert read_json(raw, f"/{chroot}/brokers/topics/orders") == {
        "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]}, "topic_id": topic_id_to_str(tid),
        "adding_replicas": {}, "removing_replicas": {}, "version": 3}
    assert len(topic_id_to_str(tid)) == 22 and "=" not in topic_id_to_str(tid)
    assert read_json(raw, f"/{chroot}/config/topics/orders") == {"version": 1, "config": {"cleanup.policy": "compact"}}
    states = store.create_partition_states({("orders", 0): LeaderAndIsr(1, 0, (1, 2, 3), 1),
                                           ("orders", 1): LeaderAndIsr(2, 0, (2, 3, 1), 1)}, epoch)
    assert read_json(raw, f"/{chroot}/brokers/topics/orders/partitions/0/state") == {
        "controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0, "isr": [1, 2, 3]}
    # The leader shrinks its ISR (no epoch: not the controller) ...
    shrunk = store.update_partition_state(("orders", 0), LeaderAndIsr(1, 0, (1, 2), 1, states[("orders", 0)].version), None)
    # ... so the controller's write based on the old version must fail, not overwrite it.
    with pytest.raises(StaleVersion):
        store.update_partition_state(("orders", 0), LeaderAndIsr(NO_LEADER, 1, (1, 2, 3), 1, states[("orders", 0)].version), epoch)
    assert store.partition_states("orders")[0] == shrunk
    with pytest.raises(StaleVersion):
        store.create_partition_states({("orders", 1): LeaderAndIsr(2, 0, (2,), 1)}, epoch)
    assert store.partition_states("nope") == {}
    with pytest.raises(TopicExists):
        store.create_topic(TopicAssignment("orders", uuid.uuid4(), {0: (1,)}), {})
    assert store.topics()["orders"] == TopicAssignment("orders", tid, {0: (1, 2, 3), 1: (2, 3, 1)})


def test_topic_lifecycle_configs_and_watches(stores, connect, raw):
    chroot = connect.partition("/")[2]
    admin, controller = stores(), stores()
    epoch = controller.elect_controller(1)
    events = {name: threading.Event() for name in ("topics", "topic_deletions", "config_changes")}
    for name, event in events.items():
        controller.watch(name, event.set)
    tid = uuid.uuid4()
    admin.create_topic(TopicAssignment("a", tid, {0: (1,)}), {})
    assert events["topics"].wait(30)
    events["topics"].clear()
    # A changed assignment (CreatePartitions) is a "topics" change too.
    admin.set_assignment(TopicAssignment("a", tid, {0: (1,), 1: (1,)}), None)
    assert events["topics"].wait(30)
    assert controller.topics()["a"].partitions == {0: (1,), 1: (1,)}

    admin.set_topic_configs("a", {"retention.ms": "1000"})
    assert events["config_changes"].wait(30)
    assert controller.topic_configs("a") == {"retention.ms": "1000"}
    changes = raw.get_children(f"/{chroot}/config/changes")
    assert len(changes) == 1 and changes[0].startswith("config_change_")
    assert read_json(raw, f"/{chroot}/config/changes/{changes[0]}") == {"version": 2, "entity_path": "topics/a"}
    with pytest.raises(NoSuchTopic):
        admin.set_topic_configs("missing", {})
    admin.set_broker_configs(None, {"log.retention.ms": "5"})
    admin.set_broker_configs(2, {"log.retention.ms": "6"})
    assert controller.broker_configs(None) == {"log.retention.ms": "5"}
    assert controller.broker_configs(2) == {"log.retention.ms": "6"}
    assert read_json(raw, f"/{chroot}/config/brokers/<default>")["config"] == {"log.retention.ms": "5"}
    changes = controller.config_changes(-1)
    assert [path for _, path in changes] == ["topics/a", "brokers/<default>", "brokers/2"]
    assert controller.config_changes(changes[0][0]) == changes[1:]
    # Kafka's older version-1 notification names the entity by type and name.
    raw.create(f"/{chroot}/config/changes/config_change_", b'{"version":1,"entity_type":"topics","entity_name":"a"}',
               sequence=True)
    assert [path for _, path in controller.config_changes(changes[-1][0])] == ["topics/a"]
    controller.purge_config_changes(0)
    assert len(raw.get_children(f"/{chroot}/config/changes")) == 4
    controller.purge_config_changes(2**62)
    assert raw.get_children(f"/{chroot}/config/changes") == [] and controller.config_changes(-1) == []

    controller.create_partition_states({("a", 0): LeaderAndIsr(1, 0, (1,), 1),
                                        ("a", 1): LeaderAndIsr(1, 0, (1,), 1)}, epoch)
    admin.request_topic_deletion("a")
    assert events["topic_deletions"].wait(30)
    assert controller.topics_to_delete() == {"a"}
    with pytest.raises(TopicExists):
        admin.create_topic(TopicAssignment("a", uuid.uuid4(), {0: (1,)}), {})
    controller.complete_topic_deletion("a", epoch)
    assert controller.topics() == {} and controller.topics_to_delete() == set()
    assert not raw.exists(f"/{chroot}/config/topics/a") and not raw.exists(f"/{chroot}/brokers/topics/a")
    with pytest.raises(NoSuchTopic):
        admin.request_topic_deletion("a")
    admin.create_topic(TopicAssignment("a", uuid.uuid4(), {0: (1,)}), {})  # the name is free again


def test_isr_notifications_reassignment_and_preferred_election(stores, connect, raw):
    chroot = connect.partition("/")[2]
    broker, controller = stores(), stores()
    epoch = controller.elect_controller(1)
    isr_event, reassign_event, preferred_event = threading.Event(), threading.Event(), threading.Event()
    controller.watch("isr_changes", isr_event.set)
    controller.watch("partition_reassignment", reassign_event.set)
    controller.watch("preferred_replica_election", preferred_event.set)

    broker.notify_isr_change({("t", 0), ("t", 1)})
    broker.notify_isr_change({("u", 0)})
    assert isr_event.wait(30)
    assert controller.take_isr_changes() == {("t", 0), ("t", 1), ("u", 0)}
    assert controller.take_isr_changes() == set()

    broker.request_reassignment({("t", 0): (2, 3)})
    broker.request_reassignment({("t", 1): (3, 1)})
    assert reassign_event.wait(30)
    assert read_json(raw, f"/{chroot}/admin/reassign_partitions") == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2, 3]}, {"topic": "t", "partition": 1, "replicas": [3, 1]}]}
    controller.clear_reassignment({("t", 0)}, epoch)
    assert controller.reassignment_request() == {("t", 1): (3, 1)}
    controller.clear_reassignment({("t", 1)}, epoch)
    assert controller.reassignment_request() == {} and not raw.exists(f"/{chroot}/admin/reassign_partitions")

    broker.request_preferred_election({("t", 0)})
    assert preferred_event.wait(30)
    assert read_json(raw, f"/{chroot}/admin/preferred_replica_election") == {
        "version": 1, "partitions": [{"topic": "t", "partition": 0}]}
    assert controller.preferred_election_request() == {("t", 0)}
    stale = type(epoch)(epoch.epoch - 1, epoch.version - 1)
    with pytest.raises(ControllerMoved):
        controller.clear_preferred_election(stale)
    controller.clear_preferred_election(epoch)
    assert controller.preferred_election_request() == set()


def test_producer_id_blocks_unique_across_concurrent_clients(stores, connect, raw):
    chroot = connect.partition("/")[2]
    clients = [stores() for _ in range(4)]
    claimed: list[tuple[int, int]] = []
    lock = threading.Lock()

    def claim(i):
        for _ in range(15):
            block = clients[i].claim_producer_id_block(i, 1000)
            with lock:
                claimed.append(block)
    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == [(n * 1000, n * 1000 + 999) for n in range(60)]
    latest = read_json(raw, f"/{chroot}/latest_producer_id_block")
    assert latest["version"] == 1 and latest["block_start"] == "59000" and latest["block_end"] == "59999"
    manager = ProducerIdManager(ZkProducerIdBlockStore(clients[0]), broker_id=0)
    assert manager.generate_producer_id() == 60000


def test_missing_chroot_is_a_clear_error(zk_server, raw):
    with pytest.raises(StoreUnavailable, match="chroot /no-such-chroot does not exist"):
        ZkClusterStore(f"{zk_server.connect}/no-such-chroot", session_timeout_ms=SESSION_MS)
    assert not raw.exists("/no-such-chroot")


def test_unanswered_connect_gives_store_unavailable_within_the_timeout():
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no ZooKeeper answered within 1500 ms"):
        ZkClusterStore(f"127.0.0.1:{port}", session_timeout_ms=SESSION_MS, connection_timeout_ms=1500)
    assert time.monotonic() - started < 30  # bounded: a hang would hit the test timeout instead


SESSION_CHILD = textwrap.dedent("""
    import sys, threading
    from ottla.cluster.zk import ZkClusterStore
    from ottla.cluster.store import BrokerRegistration
    store = ZkClusterStore(sys.argv[1], session_timeout_ms=int(sys.argv[2]))
    lost = threading.Event()
    store.on_session_lost(lost.set)
    store.register_broker(BrokerRegistration(7, "127.0.0.1", 1))
    print("registered", flush=True)
    lost.wait()
    print("lost", flush=True)
    store.register_broker(BrokerRegistration(7, "127.0.0.1", 1))
    print("re-registered", flush=True)
    sys.stdin.read()
""")


def line_reader(stream) -> "queue.Queue[str]":
    """A child's stdout lines in a queue, so the test waits with a timeout, never hangs."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in stream], daemon=True).start()
    return lines


def test_session_expiry_drops_ephemerals_and_fires_the_callback(stores, connect):
    """SIGSTOP a client past its session timeout: ZooKeeper expires the session, deletes its
    registration, and the client learns it when it runs again (then registers anew)."""
    child = subprocess.Popen([sys.executable, "-c", SESSION_CHILD, connect, "3000"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ})
    lines = line_reader(child.stdout)
    try:
        assert lines.get(timeout=60) == "registered"
        observer = stores()
        first = observer.live_brokers()[7]
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: 7 not in observer.live_brokers(), what="the expired session's registration to go")
        os.kill(child.pid, signal.SIGCONT)
        assert lines.get(timeout=60) == "lost"
        assert lines.get(timeout=60) == "re-registered"
        assert observer.live_brokers()[7].epoch > first.epoch
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()


def test_store_survives_the_ensemble_losing_its_leader(tmp_path):
    with zookeeper_ensemble(3, root=tmp_path) as ensemble:
        store = ZkClusterStore(ensemble.connect, session_timeout_ms=6000, connection_timeout_ms=30000)
        try:
            store.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
            epoch = store.elect_controller(1)
            ensemble.leader().kill()
            ensemble.leader()  # the remaining two elect a new one
            # The session and its ephemerals survive; writes work through the new quorum.
            assert set(store.live_brokers()) == {1}
            assert store.controller_id() == 1
            store.create_topic(TopicAssignment("t", uuid.uuid4(), {0: (1,)}), {})
            store.create_partition_states({("t", 0): LeaderAndIsr(1, 0, (1,), epoch.epoch)}, epoch)
            assert store.claim_producer_id_block(1, 1000) == (0, 999)
            # The killed member comes back; then the leader hangs (SIGSTOP) instead of dying.
            killed = next(s for s in ensemble.servers if not s.running())
            killed.start()
            hung = ensemble.leader()
            hung.pause()
            try:
                assert ensemble.leader() is not hung
                assert store.claim_producer_id_block(1, 1000) == (1000, 1999)
                assert set(store.live_brokers()) == {1}
            finally:
                hung.resume()
        finally:
            store.close()


def test_calls_give_store_unavailable_while_zookeeper_is_down_then_work_again(tmp_path):
    with zookeeper(root=tmp_path / "zk") as server:
        store = ZkClusterStore(server.connect, session_timeout_ms=SESSION_MS, connection_timeout_ms=2000)
        try:
            store.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
            server.kill()
            with pytest.raises(StoreUnavailable, match="did not answer within 2000 ms"):
                store.live_brokers()
            with pytest.raises(StoreUnavailable):
                store.claim_producer_id_block(1, 1000)
            server.start()  # same data dir: the session is still valid if it reconnects in time
            wait_for(lambda: _answers(store), what="the store to answer again")
            assert store.claim_producer_id_block(1, 1000) == (0, 999)
        finally:
            store.close()


def _answers(store) -> bool:
    try:
        store.live_brokers()
        return True
    except StoreUnavailable:
        return False


def test_watches_keep_firing_after_the_session_expires(stores, connect):
    """Expire a store's session the way ZooKeeper's own tests do: a second client joins the
    same session and closes it. The store gets a new session; its watches still fire."""
    store, other = stores(), stores()
    lost = threading.Event()
    saw_new_topic = threading.Event()
    store.on_session_lost(lost.set)
    store.watch("topics", lambda: "after-expiry" in store.topics() and saw_new_topic.set())
    store.register_broker(BrokerRegistration(1, "127.0.0.1", 9092))
    session_id, password = store._zk.client_id
    killer = KazooClient(hosts=connect.partition("/")[0], client_id=(session_id, password))
    killer.start(timeout=30)
    killer.stop()
    killer.close()
    assert lost.wait(60)
    wait_for(lambda: 1 not in other.live_brokers(), what="the expired session's registration to go")
    wait_for(lambda: _answers(store), what="the store's new session")
    other.create_topic(TopicAssignment("after-expiry", uuid.uuid4(), {0: (1,)}), {})
    assert saw_new_topic.wait(30)


def test_topics_larger_than_one_multi_are_created_and_deleted_whole(stores, monkeypatch):
    """ZooKeeper refuses a request over 1 MB, so big topics take several fenced multis."""
    import ottla.cluster.zk as zk_module
    monkeypatch.setattr(zk_module, "MULTI_MAX_OPS", 10)
    store = stores()
    epoch = store.elect_controller(1)
    store.create_topic(TopicAssignment("big", uuid.uuid4(), {p: (1,) for p in range(25)}), {})
    store.create_partition_states({("big", p): LeaderAndIsr(1, 0, (1,), 1) for p in range(25)}, epoch)
    assert sorted(store.partition_states("big")) == list(range(25))
    store.request_topic_deletion("big")
    store.complete_topic_deletion("big", epoch)  # 25 * 3 + 3 deletes in 8 multis
    assert store.topics() == {} and store.topics_to_delete() == set() and store.partition_states("big") == {}


def test_pipelined_partition_state_updates_refuse_each_stale_version_on_its_own(stores, connect, raw):
    """The controller's election after a broker failure: many fenced, version-conditional
    writes sent together; a partition whose leader changed its ISR meanwhile is refused alone."""
    store = stores()
    epoch = store.elect_controller(1)
    store.create_topic(TopicAssignment("t", uuid.uuid4(), {p: (1, 2) for p in range(50)}), {})
    states = store.create_partition_states({("t", p): LeaderAndIsr(1, 0, (1, 2), 1) for p in range(50)}, epoch)
    shrunk = store.update_partition_state(("t", 7), LeaderAndIsr(1, 0, (1,), 1, states[("t", 7)].version), None)
    written = store.update_partition_states({("t", p): LeaderAndIsr(2, 1, (2,), 1, states[("t", p)].version)
                                             for p in range(50)}, epoch)
    assert isinstance(written[("t", 7)], StaleVersion)
    now = store.partition_states("t")
    assert now[7] == shrunk
    for p in set(range(50)) - {7}:
        assert written[("t", p)] == now[p] and (now[p].leader, now[p].version) == (2, 1)
    assert isinstance(store.update_partition_states(
        {("gone", 0): LeaderAndIsr(2, 1, (2,), 1, 0)}, epoch)[("gone", 0)], NoSuchTopic)

    store.resign_controller(1)
    assert stores().elect_controller(2).epoch == 2  # the first controller is deposed
    with pytest.raises(ControllerMoved):
        store.update_partition_states({("t", p): LeaderAndIsr(1, 2, (1,), 1, now[p].version) for p in (0, 1)}, epoch)
    assert store.partition_states("t") == now
