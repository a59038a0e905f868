"""The cluster CLI (`topics describe`, `cluster describe`, `topics reassign`, `cluster elect-leaders`)
run as users run it, against ZooKeeper and three real `ottla serve` processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ottla.testing import cluster
from tests.waiting import wait_for


def run_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "ottla.cli", *args, "--timeout", "20"],
                            env={**os.environ, "OTTLA_BOOTSTRAP": bootstrap}, capture_output=True, timeout=120)
    result.out, result.err = result.stdout.decode(), result.stderr.decode()
    assert "Traceback" not in result.err, result.err
    return result


def ok(result):
    assert result.returncode == 0, result.err
    return result


def table(text: str, header: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    names = lines[start].split()
    return [dict(zip(names, line.split())) for line in
            __import__("itertools").takewhile(str.strip, lines[start + 1:])]


def fields(text: str) -> dict[str, str]:
    return {line.split(None, 1)[0]: line.split(None, 1)[1].strip()
            for line in text.splitlines() if len(line.split(None, 1)) == 2}


@pytest.fixture(scope="module")
def shared_three(tmp_path_factory):
    # No automatic preferred-leader rebalance: the election test must see the one it asks for.
    # A dead follower leaves the ISR at once when the controller sees the death, but after
    # `replica.lag.time.max.ms` (the leader's shrink) when the dead broker was the controller.
    with cluster(brokers=3, config={"auto.leader.rebalance.enable": "false", "replica.lag.time.max.ms": 3000},
                 root=tmp_path_factory.mktemp("cli-cluster")) as handle:
        cli = lambda *args: run_cli(handle.brokers[1].bootstrap, *args)  # noqa: E731
        ok(cli("topics", "create", "spread", "-p", "6", "-r", "1"))
        ok(cli("topics", "create", "wide", "-p", "3", "-r", "3"))
        ok(cli("topics", "create", "moving", "-p", "1", "-r", "1"))
        yield handle, cli


@pytest.fixture
def three(shared_three):
    shared_three[0].restore()  # a test that failed midway leaves nothing down for the next
    return shared_three


def metadata_row(bootstrap: str, topic: str) -> dict[str, str] | None:
    """Partition 0's replicas and leader as confluent-kafka's Metadata gives them."""
    from confluent_kafka.admin import AdminClient

    info = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20).topics.get(topic)
    if info is None or info.error is not None or 0 not in info.partitions or info.partitions[0].leader < 0:
        return None
    p = info.partitions[0]
    return {"REPLICAS": ",".join(map(str, p.replicas)), "LEADER": str(p.leader)}


def partitions(cli, topic, *flags):
    return table(ok(cli("topics", "describe", topic, *flags)).out, "PARTITION")


def test_topics_describe_shows_leaders_spread_and_isr(three):
    _, cli = three
    spread = wait_for(lambda: (lambda rows: rows if all(r["LEADER"] != "-" for r in rows) else None)(
        partitions(cli, "spread")), what="spread leaders")
    assert sorted(r["LEADER"] for r in spread) == ["1", "1", "2", "2", "3", "3"]
    assert all(r["REPLICAS"] == r["ISR"] == r["LEADER"] and r["STATUS"] == "-" for r in spread)
    wide = wait_for(lambda: (lambda rows: rows if all(r["ISR"].count(",") == 2 for r in rows) else None)(
        partitions(cli, "wide")), what="wide ISR of 3")
    assert sorted(r["LEADER"] for r in wide) == ["1", "2", "3"]
    for row in wide:
        assert sorted(row["REPLICAS"].split(",")) == ["1", "2", "3"]
        assert row["REPLICAS"].split(",")[0] == row["LEADER"]  # the preferred replica leads
        assert int(row["LEADER-EPOCH"]) >= 0
    described = ok(cli("cluster", "describe")).out
    assert fields(described)["BROKERS"] == "3"
    assert fields(described)["CONTROLLER"] in {"1", "2", "3"}
    brokers = table(described, "BROKER")
    assert [b["BROKER"] for b in brokers] == ["1", "2", "3"]
    assert {b["HOST:PORT"] for b in brokers} == {three[0].brokers[i].bootstrap for i in (1, 2, 3)}
    assert [b["BROKER"] for b in brokers if b["CONTROLLER"] == "yes"] == [fields(described)["CONTROLLER"]]


def test_reassign_then_preferred_election_moves_the_leader(three):
    _, cli = three
    row = wait_for(lambda: (lambda r: r if r["ISR"].count(",") == 2 else None)(partitions(cli, "wide")[0]),
                   what="wide-0 ISR of 3")
    replicas = row["REPLICAS"].split(",")
    assert row["LEADER"] == replicas[0]
    again = ok(cli("cluster", "elect-leaders", "--topic", "wide", "--partition", "0"))
    assert again.out.strip() == "Valid replica already elected for partitions wide-0"

    # Same replicas, another preferred leader: every target replica is in the ISR, so the
    # reassignment completes at once and the leader stays until a preferred election.
    reordered = replicas[1:] + replicas[:1]
    ok(cli("topics", "reassign", "wide", "-p", "0", "--replicas", ",".join(reordered)))
    wait_for(lambda: partitions(cli, "wide")[0]["REPLICAS"] == ",".join(reordered), what="reassignment")
    assert table(ok(cli("topics", "reassignments")).out, "TOPIC") == []
    assert partitions(cli, "wide")[0]["LEADER"] == replicas[0]
    elected = ok(cli("cluster", "elect-leaders", "--type", "preferred", "--topic", "wide", "--partition", "0"))
    assert elected.out.strip() == "Successfully completed leader election (PREFERRED) for partitions wide-0"
    wait_for(lambda: partitions(cli, "wide")[0]["LEADER"] == reordered[0], what="preferred leader")

    # Shrinking to a subset of the ISR also completes: the removed replica leaves.
    ok(cli("topics", "reassign", "wide", "-p", "0", "--replicas", ",".join(reordered[:2])))
    wait_for(lambda: partitions(cli, "wide")[0]["REPLICAS"] == ",".join(reordered[:2]), what="shrink")


def test_reassignment_to_another_broker_moves_the_data(three):
    """Moving an RF=1 partition to another broker: the new replica copies the log from the old
    leader, joins the ISR, takes the leadership, and the old replica leaves; every record
    written before the move is read back from the new leader, and nothing stays listed."""
    from confluent_kafka import Consumer, Producer

    handle, cli = three
    # Read through Metadata, not `topics describe`: its DescribeConfigs intermittently answers
    # "Topic moving does not exist" from a broker that holds no replica of the topic.
    bootstrap = handle.brokers[1].bootstrap
    row = wait_for(lambda: metadata_row(bootstrap, "moving"), what="moving")
    target = "1" if row["REPLICAS"] != "1" else "2"
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(100):
        producer.produce("moving", value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    ok(cli("topics", "reassign", "moving", "-p", "0", "--replicas", target))
    wait_for(lambda: (lambda r: r if r and (r["REPLICAS"], r["LEADER"]) == (target, target) else None)(
        metadata_row(bootstrap, "moving")), what="the move to complete")
    assert table(ok(cli("topics", "reassignments")).out, "TOPIC") == []
    # The old replica's StopReplica (delete) removes its copy (it stayed until the topic went).
    wait_for(lambda: not (handle.brokers[int(row["REPLICAS"])].data_dir / "moving-0").exists(),
             what="the old replica's files deleted")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "moved-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["moving"])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 100 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            seen.append(message.value())
    consumer.close()
    assert seen == [b"v%d" % i for i in range(100)]


def test_killed_broker_shows_offline_and_under_replicated_partitions(three):
    handle, _ = three
    victim = 3
    cli = lambda *args: run_cli(handle.brokers[1].bootstrap, *args)  # noqa: E731
    led = {r["PARTITION"] for r in partitions(cli, "spread") if r["LEADER"] == str(victim)}
    assert len(led) == 2
    followed = len([r for r in partitions(cli, "wide") if str(victim) in r["REPLICAS"].split(",")])
    handle.brokers[victim].kill()

    def victim_gone():
        out = ok(cli("cluster", "describe")).out
        if fields(out)["BROKERS"] != "2" or int(fields(out)["OFFLINE"]) < 2:
            return None
        under_wide = [r for r in table(out, "TOPIC") if r["TOPIC"] == "wide" and r["STATUS"] == "under-replicated"]
        return out if len(under_wide) >= followed else None
    described = wait_for(victim_gone, timeout=180.0, what="broker 3 gone")
    unhealthy = table(described, "TOPIC")
    offline = {r["PARTITION"] for r in unhealthy if r["TOPIC"] == "spread" and r["STATUS"] == "offline"}
    assert offline == led
    assert all(r["OFFLINE"] == str(victim) for r in unhealthy if r["TOPIC"] == "spread")
    under = {r["PARTITION"] for r in unhealthy if r["TOPIC"] == "wide" and r["STATUS"] == "under-replicated"}
    assert under == {r["PARTITION"] for r in partitions(cli, "wide") if str(victim) in r["REPLICAS"].split(",")}
    assert under and fields(described)["UNDER-REPLICATED"] == str(len(
        [r for r in unhealthy if r["STATUS"] == "under-replicated"]))
    only_offline = partitions(cli, "spread", "--unavailable-partitions")
    assert {r["PARTITION"] for r in only_offline} == led and all(r["LEADER"] == "-" for r in only_offline)
    assert {r["PARTITION"] for r in partitions(cli, "wide", "--under-replicated-partitions")} == under
