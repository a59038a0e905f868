"""Brokers joining a ZooKeeper cluster: registration, cluster id, producer ids, bad input.

Real ZooKeeper, real `ottla serve` processes (`ottla.testing.cluster`), real clients.
"""

from __future__ import annotations

from functools import partial
import datetime
import json
import socket
import subprocess
import sys
import threading

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.static.primitive import i16, i64

from ottla.testing import BrokerProcess, cluster
from ottla.testing.zookeeper import free_port, zookeeper
from tests.wire import roundtrip
from tests.waiting import wait_for as _wait_for


@pytest.fixture(scope="module")
def shared_zk_cluster(tmp_path_factory):
    with cluster(brokers=2, root=tmp_path_factory.mktemp("cluster")) as handle:
        yield handle


@pytest.fixture
def zk_cluster(shared_zk_cluster):
    return shared_zk_cluster.restore()  # a test that failed midway leaves nothing down for the next


@pytest.fixture
def zk(zk_cluster, zk_client):
    return zk_client(zk_cluster.connect)


wait_for = partial(_wait_for, timeout=60.0, interval=0.1)


def registration(zk, broker_id):
    data, stat = zk.get(f"/brokers/ids/{broker_id}")
    return json.loads(data), stat


def serve(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ottla.cli", "serve", "--listen", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_brokers_register_with_kafkas_json_and_share_one_cluster_id(zk_cluster, zk):
    assert sorted(zk.get_children("/brokers/ids")) == ["1", "2"]
    for broker_id, handle in zk_cluster.brokers.items():
        data, stat = registration(zk, broker_id)
        assert stat.ephemeralOwner != 0
        assert data["version"] == 5 and data["endpoints"] == [f"PLAINTEXT://{handle.bootstrap}"]
        assert (data["host"], data["port"]) == ("127.0.0.1", handle.port)
    cluster_id = json.loads(zk.get("/cluster/id")[0])["id"]
    for handle in zk_cluster.brokers.values():
        assert f"cluster.id={cluster_id}\n" in (handle.data_dir / "meta.properties").read_text()
        metadata = AdminClient({"bootstrap.servers": handle.bootstrap}).list_topics(timeout=30)
        assert metadata.cluster_id == cluster_id


def test_producer_ids_are_unique_across_brokers_and_restarts(zk_cluster, zk, raw_connection):
    ids = []
    for round_ in range(2):
        for handle in zk_cluster.brokers.values():
            sock = raw_connection(handle.bootstrap)
            for _ in range(3):
                _, response = roundtrip(sock, InitProducerIdRequest(
                    transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=i64(-1), producer_epoch=i16(-1)))
                assert response.error_code == ErrorCode.none
                ids.append(response.producer_id)
        if round_ == 0:
            zk_cluster.brokers[1].restart(crash=True)
    assert len(set(ids)) == len(ids), sorted(ids)
    # Three blocks claimed in ZooKeeper: broker 1, broker 2, broker 1 after its crash.
    latest = json.loads(zk.get("/latest_producer_id_block")[0])
    assert latest["version"] == 1 and int(latest["block_end"]) - int(latest["block_start"]) == 999
    assert {pid // 1000 for pid in ids} == {0, 1, int(latest["block_start"]) // 1000}


def test_duplicate_broker_id_is_refused_and_leaves_the_registration_alone(zk_cluster, zk, tmp_path):
    before = registration(zk, 2)
    intruder = BrokerProcess(tmp_path / "intruder", {"zookeeper.connect": zk_cluster.connect, "broker.id": 2},
                             start_timeout=120)
    with pytest.raises(RuntimeError, match="exited with 1") as failure:
        intruder.start()
    assert "broker.id 2 is registered at /brokers/ids/2 by another live broker" in str(failure.value)
    assert intruder.read_stderr().count("serving on") == 0  # never reported ready
    after = registration(zk, 2)
    assert after[1].czxid == before[1].czxid and after[0]["port"] == zk_cluster.brokers[2].port


def test_broker_id_and_node_id_must_agree(zk_cluster):
    result = serve(["--data-dir", "/nonexistent-never-created", "--config", f"zookeeper.connect={zk_cluster.connect}",
                    "--config", "broker.id=5", "--config", "node.id=6"])
    assert result.returncode == 2
    assert "broker.id and node.id must have the same value" in result.stderr


def test_session_expiry_unregisters_then_the_broker_registers_again(zk_cluster, zk):
    """SIGSTOP past zookeeper.session.timeout.ms (6 s here), then SIGCONT."""
    handle = zk_cluster.brokers[2]
    admin = AdminClient({"bootstrap.servers": zk_cluster.bootstrap})
    admin.create_topics([NewTopic("roles", num_partitions=1, replica_assignment=[[2, 1]])])["roles"].result(60)
    wait_for(lambda: roles_state(zk) == (2, [1, 2]), what="roles led by broker 2")
    first = registration(zk, 2)[1]
    handle.pause()
    try:
        wait_for(lambda: zk.exists("/brokers/ids/2") is None, what="broker 2's registration to expire")
        # Its roles go with it: broker 1 (the controller, or elected now) takes the leadership.
        wait_for(lambda: roles_state(zk) == (1, [1]), what="roles' leadership moved to broker 1")
    finally:
        handle.resume()
    wait_for(lambda: zk.exists("/brokers/ids/2") is not None, what="broker 2 to register again")
    again = registration(zk, 2)
    assert again[1].czxid > first.czxid and again[0]["port"] == handle.port
    assert AdminClient({"bootstrap.servers": handle.bootstrap}).list_topics(timeout=30).brokers
    # It rejoins cleanly: a follower of the new leader, back in the ISR, and it says so.
    wait_for(lambda: roles_state(zk) == (1, [1, 2]), what="broker 2 back in roles' ISR")
    wait_for(lambda: (lambda m: m.topics["roles"].partitions[0].leader if "roles" in m.topics else None)(
        AdminClient({"bootstrap.servers": handle.bootstrap}).list_topics("roles", timeout=30)) == 1,
        what="broker 2 naming broker 1 leader of roles")


def roles_state(zk) -> tuple[int, list[int]] | None:
    try:
        state = json.loads(zk.get("/brokers/topics/roles/partitions/0/state")[0])
    except NoNodeError:
        return None
    return state["leader"], sorted(state["isr"])


def test_a_broker_restarted_after_kill_9_answers_clients_once_it_knows_the_cluster(zk_cluster):
    """Restarted at once after kill -9, a broker waits out its old ZooKeeper session before
    registering, and hears from the controller only then. It listened meanwhile (it now
    listens once registered), and until the controller's first UpdateMetadata its Metadata
    answers named itself alone, and librdkafka drops every broker a
    Metadata answer leaves out, coordinators included: send_offsets_to_transaction() then hung
    (librdkafka #5511, #5456; test_copier_cluster.py's librdkafka copier). Its first answer
    names both brokers and the controller."""
    handle = zk_cluster.brokers[2]
    handle.kill()
    started = threading.Thread(target=handle.start)
    started.start()
    try:
        sock = wait_for(lambda: _connected(handle.bootstrap), what="broker 2 listening again", interval=0.05)
        with sock:
            sock.settimeout(60)
            _, metadata = roundtrip(sock, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                          include_topic_authorized_operations=False))
    finally:
        started.join()
    assert sorted(broker.node_id for broker in metadata.brokers) == [1, 2]
    assert metadata.controller_id in (1, 2)


def _connected(bootstrap: str) -> socket.socket | None:
    host, _, port = bootstrap.rpartition(":")
    try:
        return socket.create_connection((host, int(port)), timeout=1)
    except OSError:
        return None


def test_unanswered_zookeeper_connect_stops_the_broker(tmp_path):
    port = free_port()  # nothing listens there
    result = serve(["--data-dir", str(tmp_path / "data"), "--config", f"zookeeper.connect=127.0.0.1:{port}",
                    "--config", "zookeeper.connection.timeout.ms=1500"])
    assert result.returncode == 1
    assert f"zookeeper.connect=127.0.0.1:{port}: no ZooKeeper answered within 1500 ms" in result.stderr
    assert not (tmp_path / "data").exists()  # nothing created


def test_chroot_must_exist_and_then_holds_the_whole_cluster(tmp_path):
    with zookeeper(root=tmp_path / "zk") as server:
        missing = serve(["--data-dir", str(tmp_path / "data"), "--config", f"zookeeper.connect={server.connect}/ottla"])
        assert missing.returncode == 1 and "chroot /ottla does not exist" in missing.stderr
        assert not (tmp_path / "data").exists()
        client = KazooClient(hosts=server.connect)
        client.start(timeout=30)
        try:
            assert client.exists("/ottla") is None
            client.create("/ottla")
            handle = BrokerProcess(tmp_path / "data", {"zookeeper.connect": f"{server.connect}/ottla", "broker.id": 4,
                                                       "broker.rack": "rack-a"}, start_timeout=120)
            handle.start()
            try:
                assert client.get_children("/ottla/brokers/ids") == ["4"]
                assert json.loads(client.get("/ottla/brokers/ids/4")[0])["rack"] == "rack-a"
                assert client.exists("/ottla/cluster/id") and client.exists("/brokers") is None
                admin = KafkaAdminClient(bootstrap_servers=handle.bootstrap)
                try:
                    described = admin.describe_cluster()
                finally:
                    admin.close()
                assert [(b["broker_id"], b["rack"]) for b in described["brokers"]] == [(4, "rack-a")]
            finally:
                handle.stop()
            assert client.get_children("/ottla/brokers/ids") == []  # a clean stop ends the session at once
        finally:
            client.stop()
            client.close()


def test_ottla_cluster_broker_killed_and_restarted_at_once_takes_its_id_back(ottla_cluster, zk_client):
    """kill -9 leaves the registration until the old session times out; a restart right away
    waits for it to go instead of failing (Kafka's KAFKA-7165), then registers anew."""
    client = zk_client(ottla_cluster.connect)
    assert sorted(client.get_children("/brokers/ids")) == ["1", "2", "3"]
    before = client.get("/brokers/ids/3")[1]
    handle = ottla_cluster.brokers[3]
    handle.kill()
    handle.start()
    after = client.get("/brokers/ids/3")[1]
    assert after.czxid > before.czxid and after.ephemeralOwner != before.ephemeralOwner
    assert sorted(client.get_children("/brokers/ids")) == ["1", "2", "3"]


def test_a_data_dir_of_another_cluster_is_refused(zk_cluster, zk, tmp_path):
    """Kafka's InconsistentClusterIdException: meta.properties names the cluster a data dir
    belongs to; a broker pointed at another cluster's ZooKeeper must not mix them."""
    alone = BrokerProcess(tmp_path / "data", start_timeout=120).start()  # no zookeeper.connect: a cluster id of its own
    alone.stop()
    result = serve(["--data-dir", str(tmp_path / "data"), "--config", f"zookeeper.connect={zk_cluster.connect}",
                    "--config", "broker.id=9"])
    assert result.returncode == 1
    assert "doesn't match stored clusterId" in result.stderr and "trying to join the wrong cluster" in result.stderr
    assert zk.exists("/brokers/ids/9") is None


def test_brokers_stay_registered_while_the_zookeeper_ensemble_loses_its_leader(tmp_path):
    with cluster(brokers=2, zookeeper_nodes=3, root=tmp_path) as handle:
        client = KazooClient(hosts=handle.connect)
        client.start(timeout=30)
        try:
            before = {b: client.get(f"/brokers/ids/{b}")[1].czxid for b in (1, 2)}
            handle.zookeeper.leader().kill()
            handle.zookeeper.leader()  # the other two elect a new leader
            # The brokers' sessions move to the surviving servers: same registrations.
            assert {b: client.get(f"/brokers/ids/{b}")[1].czxid for b in (1, 2)} == before
            handle.brokers[2].restart()  # and a broker can still join
            assert client.get("/brokers/ids/2")[1].czxid > before[2]
            assert sorted(client.get_children("/brokers/ids")) == ["1", "2"]
        finally:
            client.stop()
            client.close()


def test_a_broker_is_ready_only_once_a_controller_told_it_the_cluster(tmp_path):
    """Until its first UpdateMetadata a broker knows itself alone and no controller, and a
    client bootstrapping from it waits for a controller it cannot find (librdkafka's admin
    client never asks again). So `ottla serve` reports ready only after that first update:
    with the controller stopped, a new broker does not report ready; once it is, its very
    first Metadata answer names the controller and both brokers."""
    import threading

    with cluster(brokers=1, session_timeout_ms=30_000, root=tmp_path) as one:
        one.brokers[1].pause()  # the controller: alive in ZooKeeper, answering nothing
        newcomer = one.add_broker(2, start=False)
        started = threading.Thread(target=newcomer.start)
        started.start()
        started.join(timeout=12)  # a broker that does not wait is ready well before this
        ready_without_controller = not started.is_alive()
        if ready_without_controller:
            metadata = AdminClient({"bootstrap.servers": newcomer.bootstrap}).list_topics(timeout=20)
        one.brokers[1].resume()
        started.join()
        if not ready_without_controller:
            metadata = AdminClient({"bootstrap.servers": newcomer.bootstrap}).list_topics(timeout=20)
        assert (metadata.controller_id, sorted(metadata.brokers)) == (1, [1, 2])
        assert not ready_without_controller


def test_sigterm_stops_a_broker_whose_zookeeper_is_gone(tmp_path):
    """The controlled shutdown needs ZooKeeper (the controller writes the leadership moves
    there): without it the broker skips it and stops cleanly, instead of hanging in it."""
    with cluster(brokers=2, root=tmp_path) as two:
        two.zookeeper.kill()
        for handle in two.brokers.values():
            assert handle.stop() == 0  # raises if the broker ignores SIGTERM
            assert "stopped cleanly" in handle.read_stderr()
