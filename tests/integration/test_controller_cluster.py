"""The controller on a real ZooKeeper and three real `ottla serve` processes, with real clients.

Topics created on any broker land on all three with leaders spread; clients produce and
consume across partitions led by different brokers; kill -9 of the controller moves
`/controller_epoch` and another broker takes over, after which topic creation works. SIGTERM
moves leadership before the broker stops, and the broker does not rejoin the ISRs it handed
over while it stops. A
broker restarted after kill -9 accepts connections only once registered, and drops a
partition that was moved off it while it was down. An offline partition gets a leader as soon
as its topic allows unclean election.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                  NewTopic)
from kafka import KafkaConsumer, KafkaProducer
from kazoo.exceptions import NoNodeError
from kio.index import load_request_schema
from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
from kio.schema.metadata.v12.request import MetadataRequest

from ottla.admin_client import AdminProtocolClient, BrokerError
from ottla.controller import wire
from ottla.controller.requests import ControllerRequest, LeaderAndIsrPayload, PartitionState
from ottla.errors import ErrorCode
from ottla.protocol.build import make, nested
from ottla.server.cluster_node import HOLD_AFTER_CONTROLLED_SHUTDOWN
from ottla.testing import cluster
from tests.waiting import wait_for
from tests.wire import roundtrip

# IncrementalAlterConfigs, its BROKER resource type and its SET and DELETE operations.
INCREMENTAL_ALTER_CONFIGS, BROKER_RESOURCE, SET, DELETE = 44, 4, 0, 1


def broker_logs(three) -> str:
    """The brokers' warnings, for a failure message (a session expiry under load moves leaders)."""
    out = []
    for broker_id, handle in sorted(three.brokers.items()):
        lines = [l for l in handle.stderr_path.read_text(errors="replace").splitlines() if not l.startswith("%")]
        out.append(f"broker {broker_id}: " + "\n".join(lines[-15:]))
    return "\n".join(out)


def controller_named_by(bootstrap: str) -> int:
    """The controller id in this broker's Metadata answer (what clients route admin requests by)."""
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).controller_id


def isrs(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """Partition -> ISR, as this broker's Metadata answers."""
    info = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20).topics.get(topic)
    return {} if info is None or info.error is not None else {p: list(m.isrs) for p, m in info.partitions.items()}


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> leader, as this broker's Metadata answers."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=20)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        return {}
    return {p: m.leader for p, m in info.partitions.items()}


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    with cluster(brokers=3, root=tmp_path_factory.mktemp("controller")) as handle:
        yield handle


@pytest.fixture
def three(shared_three):
    return shared_three.restore()  # a test that failed midway leaves nothing down for the next


@pytest.fixture
def zk(three, zk_client):
    return zk_client(three.connect)


def test_topic_created_on_any_broker_lands_on_all_with_leaders_spread(three):
    admin = AdminClient({"bootstrap.servers": three.brokers[2].bootstrap})
    admin.create_topics([NewTopic("spread", 6, 1), NewTopic("wide", 3, 3)])["spread"].result(60)
    for broker in three.brokers.values():
        found = wait_for(lambda: (lambda m: m if len(m) == 6 and -1 not in m.values() else None)(
            leaders(broker.bootstrap, "spread")), what=f"spread on broker {broker.bootstrap}")
        assert sorted(found.values()) == [1, 1, 2, 2, 3, 3], broker_logs(three)
        wide = wait_for(lambda: leaders(broker.bootstrap, "wide"), what="wide")
        assert sorted(wide.values()) == [1, 2, 3], broker_logs(three)


def test_every_broker_describes_the_whole_cluster(three, zk):
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    answers = set()
    for broker in three.brokers.values():
        with socket.create_connection((broker.host, broker.port), timeout=60) as sock:
            _, response = roundtrip(sock, DescribeClusterRequest(include_cluster_authorized_operations=False))
        answers.add((response.error_code, response.controller_id, response.cluster_id,
                     tuple(sorted((b.broker_id, b.port) for b in response.brokers))))
    ports = tuple(sorted((i, b.port) for i, b in three.brokers.items()))
    assert answers == {(0, controller, json.loads(zk.get("/cluster/id")[0])["id"], ports)}, answers


def test_produce_and_consume_across_brokers(three):
    admin = AdminClient({"bootstrap.servers": three.brokers[3].bootstrap})
    admin.create_topics([NewTopic("flow", 6, 1)])["flow"].result(60)
    wait_for(lambda: len(leaders(three.bootstrap, "flow")) == 6, what="flow leaders")
    producer = Producer({"bootstrap.servers": three.bootstrap, "enable.idempotence": True})
    for i in range(300):
        producer.produce("flow", key=str(i).encode(), value=f"cf-{i}".encode(), partition=i % 6)
    assert producer.flush(60) == 0
    kp = KafkaProducer(bootstrap_servers=three.bootstrap, acks="all")
    for i in range(300):
        kp.send("flow", key=str(i).encode(), value=f"kp-{i}".encode(), partition=(i + 1) % 6)
    kp.flush(60)
    kp.close()
    consumer = Consumer({"bootstrap.servers": three.bootstrap, "group.id": "flow-readers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["flow"])
    seen = set()
    deadline = time.monotonic() + 90
    while len(seen) < 600 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            seen.add((message.partition(), message.value()))
    consumer.close()
    assert len(seen) == 600
    assert {p for p, _ in seen} == set(range(6))
    reader = KafkaConsumer("flow", bootstrap_servers=three.bootstrap, auto_offset_reset="earliest",
                           consumer_timeout_ms=15000, enable_auto_commit=False)
    assert len({(m.partition, m.value) for m in reader}) == 600
    reader.close()


def test_assignments_naming_unknown_brokers_are_refused_and_create_nothing(three, zk):
    """CreateTopics, CreatePartitions and AlterPartitionReassignments naming broker 9, which
    does not exist: INVALID_REPLICA_ASSIGNMENT from a real client, and nothing written."""
    admin = AdminClient({"bootstrap.servers": three.brokers[2].bootstrap})
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic("ghostly", num_partitions=1, replica_assignment=[[1, 9]])])["ghostly"].result(60)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, refused.value
    admin.create_topics([NewTopic("grows", 1, 2)])["grows"].result(60)
    with pytest.raises(KafkaException) as refused:
        admin.create_partitions([NewPartitions("grows", 2, replica_assignment=[[1, 9]])])["grows"].result(60)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, refused.value
    with AdminProtocolClient(three.bootstrap, timeout=20) as client, pytest.raises(BrokerError) as refused:
        client.alter_partition_reassignment("grows", 0, [1, 9], timeout_ms=30000)
    assert refused.value.code == ErrorCode.invalid_replica_assignment
    assert zk.exists("/brokers/topics/ghostly") is None and zk.exists("/admin/reassign_partitions") is None
    assert list(json.loads(zk.get("/brokers/topics/grows")[0])["partitions"]) == ["0"]
    assert zk.get_children("/brokers/topics/grows/partitions") == ["0"]
    for broker in three.brokers.values():
        assert not list(broker.data_dir.glob("ghostly-*")) and not list(broker.data_dir.glob("grows-1"))
        assert len(wait_for(lambda: leaders(broker.bootstrap, "grows"), what="grows known")) == 1


def test_kill_the_controller_another_takes_over(three, zk):
    before = json.loads(zk.get("/controller")[0])["brokerid"]
    epoch_before = int(zk.get("/controller_epoch")[0])
    three.brokers[before].kill()

    def new_controller():
        try:  # one read: /controller can vanish between an exists() and a get()
            current = json.loads(zk.get("/controller")[0])["brokerid"]
        except NoNodeError:  # the dead broker's session ended, no successor elected yet
            return None
        return current if current != before else None
    # The dead broker's session (and its /controller) lasts until the session timeout.
    after = wait_for(new_controller, what="a new controller\n" + broker_logs(three))
    assert after in three.brokers and after != before
    assert int(zk.get("/controller_epoch")[0]) > epoch_before
    survivors = [b for i, b in three.brokers.items() if i != before]
    # A client asks a broker for the controller; each survivor learns of the new one from its
    # UpdateMetadata, a moment after the election (a client asking before that is sent to the
    # dead broker and waits out its timeout, as with Kafka).
    for survivor in survivors:
        wait_for(lambda: controller_named_by(survivor.bootstrap) == after,
                 what=f"{survivor.bootstrap} to name controller {after}\n" + broker_logs(three))
    # `spread` has one replica per partition: the two the dead broker led have no leader now
    # (the controller's state still names it; clients must not be sent to a dead broker).
    assert sorted(leaders(survivors[0].bootstrap, "spread").values()).count(-1) == 2
    assert before not in leaders(survivors[0].bootstrap, "spread").values()
    # `wide` has no traffic, so no leader would ever find the dead follower lagging: the new
    # controller takes it out of every ISR at failover.
    wait_for(lambda: (lambda found: len(found) == 3 and all(before not in isr for isr in found.values()))(
        isrs(survivors[0].bootstrap, "wide")), what="the dead controller out of wide's ISRs\n" + broker_logs(three))
    # `wide`'s partitions the dead broker led have moved to a survivor.
    wide = wait_for(lambda: (lambda m: m if len(m) == 3 and all(l not in (before, -1) for l in m.values()) else None)(
        leaders(survivors[0].bootstrap, "wide")), what="wide led by survivors\n" + broker_logs(three))
    # The deposed controller's requests are refused and change nothing: a LeaderAndIsr of its
    # epoch naming itself leader of wide-0 at a leader epoch far ahead of the real one.
    state = PartitionState("wide", 0, epoch_before, before, 1000, (before,), 1000, (1, 2, 3))
    for survivor in survivors:
        stale = ControllerRequest(0, "LeaderAndIsr", LeaderAndIsrPayload(
            before, epoch_before, -1, (state,), {}, ()))
        with socket.create_connection((survivor.host, survivor.port), timeout=60) as sock:
            _, response = roundtrip(sock, wire.to_message(stale)[2])
        assert response.error_code == ErrorCode.stale_controller_epoch, response
        assert leaders(survivor.bootstrap, "wide") == wide and controller_named_by(survivor.bootstrap) == after
    admin = AdminClient({"bootstrap.servers": survivors[0].bootstrap})
    admin.create_topics([NewTopic("after-failover", 4, 1)])["after-failover"].result(60)
    found = wait_for(lambda: (lambda m: m if len(m) == 4 and -1 not in m.values() else None)(
        leaders(survivors[1].bootstrap, "after-failover")), what="after-failover leaders\n" + broker_logs(three))
    assert before not in found.values()
    # The old controller comes back as an ordinary broker and learns the new state.
    three.brokers[before].start()
    wait_for(lambda: len(leaders(three.brokers[before].bootstrap, "after-failover")) == 4,
             what="the restarted broker's metadata")


def partition_state(zk, topic: str, partition: int) -> dict:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def test_sigterm_moves_leadership_before_the_broker_stops(three, zk):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("handover", 3, 3)])["handover"].result(60)
    wait_for(lambda: len(leaders(three.bootstrap, "handover")) == 3, what="handover leaders")
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    leaving = next(b for b in sorted(three.brokers) if b != controller)
    led = [p for p in range(3) if partition_state(zk, "handover", p)["leader"] == leaving]
    assert led, "every broker leads one partition of a 3-partition, 3-replica topic"
    three.brokers[leaving].stop()  # SIGTERM: ControlledShutdown first, then the session ends
    # ZooKeeper orders every write: the registration's deletion is /brokers/ids's last child
    # change (pzxid). With a controlled shutdown every leader moved before it; without one
    # the controller only starts moving leaders after it.
    deregistered = zk.get("/brokers/ids")[1].pzxid
    for p in range(3):
        data, stat = zk.get(f"/brokers/topics/handover/partitions/{p}/state")
        state = json.loads(data)
        assert state["leader"] not in (leaving, -1) and leaving not in state["isr"], state
        if p in led:
            assert stat.mzxid < deregistered, (p, state)
    three.brokers[leaving].start()
    wait_for(lambda: zk.exists(f"/brokers/ids/{leaving}"), what="the broker to rejoin")


def test_a_stopping_broker_does_not_rejoin_the_isrs_it_handed_over(three, zk):
    """A SIGTERMed broker that lingers after handing its leadership over (the failpoint holds it
    a second, as resigning the controller role on a loaded machine did) must not fetch what it
    handed over: the new leader would take it back into the ISR at once (it has the whole
    log), and acks=all would wait for a broker on its way out until the controller saw it gone
    (1.1-2.6 s without acknowledgements in benchmarks/failover.py)."""
    leaving, *others = sorted(three.brokers)
    three.brokers[leaving].env = {"OTTLA_FAILPOINTS": HOLD_AFTER_CONTROLLED_SHUTDOWN}
    three.brokers[leaving].restart()
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("handback", num_partitions=1,
                                  replica_assignment=[[leaving, *others]])])["handback"].result(60)
    wait_for(lambda: len(isrs(three.bootstrap, "handback").get(0, [])) == 3, what="handback with a full ISR")
    assert partition_state(zk, "handback", 0)["leader"] == leaving
    assert three.brokers[leaving].stop() == 0
    deregistered = zk.get("/brokers/ids")[1].pzxid
    data, stat = zk.get("/brokers/topics/handback/partitions/0/state")
    state = json.loads(data)
    assert state["leader"] in others and sorted(state["isr"]) == others, state
    # Written before the broker left: nobody put it back in the ISR while it stopped, so the
    # controller had nothing to take out once it was gone.
    assert stat.mzxid < deregistered, state
    three.brokers[leaving].env = {}
    three.brokers[leaving].start()
    wait_for(lambda: zk.exists(f"/brokers/ids/{leaving}"), what="the broker to rejoin")


def _stranded(three, zk, topic: str) -> tuple[int, int, int]:
    """A one-partition topic on the two brokers that are not the controller, made offline with
    unclean election off: the follower killed and out of the ISR, then the leader killed, then the
    follower back. Returns the controller, the last leader and the follower back (the only live
    replica)."""
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    last, out = sorted(set(three.brokers) - {controller})  # failover is tested above
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[last, out]])])[topic].result(60)
    wait_for(lambda: partition_state(zk, topic, 0)["isr"] == [last, out], what=f"{topic} with a full ISR")
    three.brokers[out].kill()
    wait_for(lambda: partition_state(zk, topic, 0)["isr"] == [last], what=f"{out} out of the ISR")
    three.brokers[last].kill()
    wait_for(lambda: partition_state(zk, topic, 0)["leader"] == -1, what=f"{topic} offline")
    three.brokers[out].start()
    wait_for(lambda: zk.exists(f"/brokers/ids/{out}"), what=f"{out} registered")
    return controller, last, out


def test_an_offline_partition_is_elected_once_its_topic_allows_unclean_election(three, zk):
    """Both replicas down, the one out of the ISR back: offline (unclean.leader.election.enable
    is false by default). An operator who accepts the loss sets it on the topic, and, as in
    Kafka, the controller elects the live replica then, not at the next broker change."""
    controller, last, out = _stranded(three, zk, "stranded")
    state = partition_state(zk, "stranded", 0)
    assert (state["leader"], state["isr"]) == (-1, [last])  # no clean election: the ISR is all gone
    live = AdminClient({"bootstrap.servers": three.brokers[controller].bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "stranded", incremental_configs=[ConfigEntry(
        "unclean.leader.election.enable", "true", incremental_operation=AlterConfigOpType.SET)])
    live.incremental_alter_configs([resource])[resource].result(30)
    wait_for(lambda: partition_state(zk, "stranded", 0)["leader"] == out, what=f"{out} elected uncleanly")
    assert partition_state(zk, "stranded", 0)["isr"] == [out]
    wait_for(lambda: leaders(three.brokers[out].bootstrap, "stranded") == {0: out}, what=f"{out} leading")


def test_an_offline_partition_is_elected_once_the_cluster_default_allows_unclean_election(three, zk):
    """As above, with the operator setting it for the whole cluster, as `kafka-configs
    --entity-type brokers --entity-default --alter --add-config unclean.leader.election.enable=true`
    does (a dynamic cluster-wide config in Kafka): the controller elects then too."""
    controller, _, out = _stranded(three, zk, "adrift")
    assert partition_state(zk, "adrift", 0)["leader"] == -1
    live = three.brokers[controller]

    def cluster_default(operation: int) -> int:
        """IncrementalAlterConfigs of the default BROKER resource "" on the wire: confluent-kafka
        and kafka-python cannot name it (Java's admin client, which kafka-configs uses, can)."""
        schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
        entry = make(nested(schema, "AlterableConfig"), name="unclean.leader.election.enable",
                     config_operation=operation, value="true" if operation == SET else None)
        with socket.create_connection((live.host, live.port), timeout=60) as sock:
            _, response = roundtrip(sock, make(schema, validate_only=False, resources=(make(
                nested(schema, "AlterConfigsResource"), resource_type=BROKER_RESOURCE, resource_name="",
                configs=(entry,)),)))
        return response.responses[0].error_code

    assert cluster_default(SET) == ErrorCode.none
    try:
        wait_for(lambda: partition_state(zk, "adrift", 0)["leader"] == out, what=f"{out} elected uncleanly")
        assert partition_state(zk, "adrift", 0)["isr"] == [out]
        wait_for(lambda: leaders(three.brokers[out].bootstrap, "adrift") == {0: out}, what=f"{out} leading")
    finally:
        assert cluster_default(DELETE) == ErrorCode.none


def test_delete_while_a_broker_is_down_completes_when_it_returns(three, zk):
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("doomed", 3, 1)])["doomed"].result(60)
    found = wait_for(lambda: (lambda m: m if len(m) == 3 and -1 not in m.values() else None)(
        leaders(three.bootstrap, "doomed")), what="doomed leaders")
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    down = next(leader for leader in found.values() if leader != controller)  # failover is tested above
    up = [b for b in three.brokers if b != down]
    three.brokers[down].kill()
    wait_for(lambda: not zk.exists(f"/brokers/ids/{down}"), what="the dead broker's session to end")
    survivor = AdminClient({"bootstrap.servers": three.brokers[up[0]].bootstrap})
    survivor.delete_topics(["doomed"], operation_timeout=30)["doomed"].result(60)
    for b in up:  # the live brokers dropped their copies at once
        wait_for(lambda: not list(three.brokers[b].data_dir.glob("doomed-*")), what=f"doomed gone on {b}")
    assert zk.exists("/admin/delete_topics/doomed") and zk.exists("/brokers/topics/doomed")
    assert list(three.brokers[down].data_dir.glob("doomed-*"))
    three.brokers[down].start()
    wait_for(lambda: not zk.exists("/brokers/topics/doomed"), what="the deletion to complete")
    assert not zk.exists("/admin/delete_topics/doomed")
    # Renamed `<name>.<id>-delete` at once (as Kafka does), removed soon after.
    assert all(p.name.endswith("-delete") for p in three.brokers[down].data_dir.glob("doomed-*"))
    wait_for(lambda: not list(three.brokers[down].data_dir.glob("doomed-*")), what="doomed removed on the returned broker")


def test_a_restarted_broker_accepts_connections_only_once_registered(three, zk):
    """A broker restarted after kill -9 waits up to a session timeout for its old registration
    to go. It listened all that while: clients got answers from a broker that knew itself
    alone, and the controller's requests meant for its previous incarnation (still
    registered) were applied, its broker epoch being unknown until it registered. Kafka
    processes no request before registering; every connection it accepts now finds its new
    registration in ZooKeeper, and every answer names the controller and all brokers."""
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    victim = next(b for b in sorted(three.brokers) if b != controller)
    handle = three.brokers[victim]
    old = zk.get(f"/brokers/ids/{victim}")[1].czxid
    handle.kill()
    registrations: list[int | None] = []   # the registration's czxid at each accepted connection
    answers: list[tuple[int, tuple[int, ...]]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            try:
                sock = socket.create_connection((handle.host, handle.port), timeout=1)
            except OSError:
                time.sleep(0.02)
                continue  # not listening yet
            with sock:
                found = zk.exists(f"/brokers/ids/{victim}")
                registrations.append(None if found is None else found.czxid)
                sock.settimeout(60)
                try:
                    _, response = roundtrip(sock, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                                  include_topic_authorized_operations=False))
                except OSError:
                    continue  # the connection ended (the broker was stopping): ask again
            answers.append((response.controller_id, tuple(sorted(b.node_id for b in response.brokers))))
            time.sleep(0.02)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        handle.start()
        wait_for(lambda: len(answers) >= 5, what="answers from the restarted broker")
    finally:
        done.set()
        asker.join()
    assert all(czxid is not None and czxid > old for czxid in registrations), (old, registrations[:5])
    assert set(answers) == {(controller, tuple(sorted(three.brokers)))}, answers[:5]


def test_a_partition_moved_off_a_down_broker_is_deleted_when_it_returns(three, zk):
    """The controller sends nothing to a broker that is not live, so the StopReplica (delete)
    of a partition reassigned away from a down broker never reaches it: when it comes back it
    finds the partition given to others in its first UpdateMetadata and deletes it."""
    controller = json.loads(zk.get("/controller")[0])["brokerid"]
    down = next(b for b in sorted(three.brokers) if b != controller)
    keeper, target = [b for b in sorted(three.brokers) if b != down]
    admin = AdminClient({"bootstrap.servers": three.bootstrap})
    admin.create_topics([NewTopic("moved-away", num_partitions=1, replica_assignment=[[down, keeper]])])["moved-away"].result(60)
    wait_for(lambda: sorted(isrs(three.bootstrap, "moved-away").get(0, [])) == sorted([down, keeper]),
             what="moved-away fully replicated")
    producer = Producer({"bootstrap.servers": three.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce("moved-away", value=b"%d" % i, partition=0)
    assert producer.flush(60) == 0
    three.brokers[down].kill()
    wait_for(lambda: not zk.exists(f"/brokers/ids/{down}"), what="the dead broker's session to end")
    with AdminProtocolClient(three.bootstrap, timeout=20) as client:
        client.alter_partition_reassignment("moved-away", 0, [keeper, target], timeout_ms=30000)
    wait_for(lambda: json.loads(zk.get("/brokers/topics/moved-away")[0])["partitions"]["0"] == [keeper, target],
             what="the reassignment to complete\n" + broker_logs(three))
    kept = three.brokers[down].data_dir / "moved-away-0"
    assert kept.is_dir()
    three.brokers[down].start()
    wait_for(lambda: not kept.exists(), what="the moved partition deleted on the returned broker\n" + broker_logs(three))
    assert not [f for f in (three.brokers[down].data_dir / ".topics").iterdir() if b"moved-away" in f.read_bytes()]
    reader = Consumer({"bootstrap.servers": three.bootstrap, "group.id": "moved-away-reader",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.subscribe(["moved-away"])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 50 and time.monotonic() < deadline:
        message = reader.poll(1.0)
        if message is not None and message.error() is None:
            seen.append(message.value())
    reader.close()
    assert seen == [b"%d" % i for i in range(50)]
