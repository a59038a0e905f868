"""`topics describe`, `cluster describe` and `cluster elect-leaders` on a single broker
(no ZooKeeper), run as users run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.waiting import wait_for


def run_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "ottla.cli", *args], capture_output=True, timeout=60,
                            env={**os.environ, "OTTLA_BOOTSTRAP": bootstrap})
    result.out, result.err = result.stdout.decode(), result.stderr.decode()
    assert "Traceback" not in result.err, result.err
    return result


@pytest.fixture
def cli(ottla_broker):
    return lambda *args: run_cli(ottla_broker.bootstrap, *args)


def ok(result):
    assert result.returncode == 0, result.err
    return result


def table(text: str, header: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    names = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(names, line.split())))
    return rows


def fields(text: str) -> dict[str, str]:
    return {line.split(None, 1)[0]: line.split(None, 1)[1].strip()
            for line in text.splitlines() if len(line.split(None, 1)) == 2}


def test_describe_on_a_single_broker(cli, ottla_broker):
    ok(cli("topics", "create", "solo", "-p", "2"))
    rows = table(ok(cli("topics", "describe", "solo")).out, "PARTITION")
    assert [(r["PARTITION"], r["LEADER"], r["LEADER-EPOCH"], r["REPLICAS"], r["ISR"], r["OFFLINE"], r["STATUS"])
            for r in rows] == [("0", "0", "0", "0", "0", "-", "-"), ("1", "0", "0", "0", "0", "-", "-")]
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert table(ok(cli("topics", "describe", "solo", flag)).out, "PARTITION") == []

    described = ok(cli("cluster", "describe")).out
    info = fields(described)
    assert (info["CONTROLLER"], info["BROKERS"], info["UNDER-REPLICATED"], info["OFFLINE"]) == ("0", "1", "0", "0")
    assert len(info["CLUSTER-ID"]) >= 22
    assert table(described, "BROKER") == [
        {"BROKER": "0", "HOST:PORT": ottla_broker.bootstrap, "RACK": "-", "CONTROLLER": "yes"}]


def test_describe_without_a_topic_describes_every_topic(cli):
    """As `kafka-topics.sh --describe` without `--topic`: every topic, internal ones too, one
    block each in name order; with a partition filter, only topics with a partition it keeps."""
    ok(cli("topics", "create", "beta", "-p", "1", "-c", "cleanup.policy=compact"))
    ok(cli("topics", "create", "alpha", "-p", "2"))
    listed = [row["NAME"] for row in table(ok(cli("topics", "list")).out, "NAME")]
    assert {"alpha", "beta"} <= set(listed)

    described = ok(cli("topics", "describe")).out
    blocks = ["NAME " + block for block in ("\n" + described).split("\nNAME ")[1:]]
    assert [fields(block)["NAME"] for block in blocks] == sorted(listed)
    alpha, beta = (blocks[sorted(listed).index(name)] for name in ("alpha", "beta"))
    assert [(r["PARTITION"], r["LEADER"], r["STATUS"]) for r in table(alpha, "PARTITION")] == [
        ("0", "0", "-"), ("1", "0", "-")]
    assert [(r["PARTITION"], r["DIRTY-RATIO"]) for r in table(beta, "PARTITION")] == [("0", "0.0000")]
    assert {r["CONFIG"]: r["VALUE"] for r in table(beta, "CONFIG")}["cleanup.policy"] == "compact"
    assert {r["CONFIG"]: r["VALUE"] for r in table(alpha, "CONFIG")}["cleanup.policy"] == "delete"

    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert ok(cli("topics", "describe", flag)).out == ""  # one broker: every partition is whole


def test_elect_leaders_on_a_single_broker(cli):
    ok(cli("topics", "create", "solo", "-p", "1"))
    result = ok(cli("cluster", "elect-leaders", "--topic", "solo", "--partition", "0"))
    assert result.out == "Valid replica already elected for partitions solo-0\n"
    missing = cli("cluster", "elect-leaders", "--type", "unclean", "--topic", "solo", "--partition", "7")
    assert missing.returncode == 1 and "solo-7: UNKNOWN_TOPIC_OR_PART" in missing.err
    usage = cli("cluster", "elect-leaders", "--topic", "solo")
    assert (usage.returncode, usage.err) == (2, "ottla: error: give --topic and --partition, or --all\n")


def test_reassign_usage_and_unknown_topic(cli):
    assert cli("topics", "reassign", "solo", "-p", "0").returncode == 2
    ghost = cli("topics", "reassign", "ghost", "-p", "0", "--replicas", "0")
    assert (ghost.returncode, ghost.err) == (1, "ottla: topic 'ghost' does not exist\n")
    assert table(ok(cli("topics", "reassignments")).out, "TOPIC") == []


def _rolled_segments(partition_dir) -> list[tuple[int, int]]:
    """(base offset, size) of each segment but the active one, in offset order."""
    segments = sorted((int(p.name[:-4]), p.stat().st_size) for p in partition_dir.glob("*.log"))
    return segments[:-1]


def _cleaner_checkpoint(data_dir, topic: str) -> int:
    lines = (data_dir / "cleaner-offset-checkpoint").read_text().splitlines()[2:]
    return next((int(line.split()[2]) for line in lines if line.split()[:2] == [topic, "0"]), -1)


def _produce(bootstrap: str, topic: str, count: int) -> None:
    """`count` updates of 10 keys, in batches of 5 (about 5 KB): several batches per segment."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, key=b"key-%d" % (i % 10), value=b"v" * 1000, partition=0)
        if i % 5 == 4:
            assert producer.flush(30) == 0
    assert producer.flush(30) == 0


def test_describe_shows_the_dirty_ratio_of_compacted_partitions(ottla_broker_factory):
    broker = ottla_broker_factory({"log.cleaner.backoff.ms": "100"})
    cli = lambda *args: run_cli(broker.bootstrap, *args)  # noqa: E731
    # min.cleanable.dirty.ratio=1: the cleaner leaves the topic alone until the test lowers it.
    ok(cli("topics", "create", "table", "-p", "2", "-c", "cleanup.policy=compact", "-c", "segment.bytes=16384",
           "-c", "min.cleanable.dirty.ratio=1"))
    ok(cli("topics", "create", "plain", "-p", "1"))
    assert "DIRTY-RATIO" not in ok(cli("topics", "describe", "plain")).out
    _produce(broker.bootstrap, "table", 60)
    partition_dir = broker.data_dir / "table-0"
    assert len(_rolled_segments(partition_dir)) >= 2

    def ratios():
        return [(r["PARTITION"], r["DIRTY-RATIO"]) for r in table(ok(cli("topics", "describe", "table")).out,
                                                                   "PARTITION")]

    # Nothing cleaned yet: every rolled segment is dirty; the empty partition has nothing to clean.
    assert ratios() == [("0", "1.0000"), ("1", "0.0000")]

    ok(cli("topics", "alter-config", "table", "--set", "min.cleanable.dirty.ratio=0.01"))
    wait_for(lambda: (broker.data_dir / "cleaner-offset-checkpoint").exists()
             and _cleaner_checkpoint(broker.data_dir, "table") > 0, what="a clean of table-0")
    assert ratios() == [("0", "0.0000"), ("1", "0.0000")]

    # New dirty segments after the clean: the ratio is their bytes over all the rolled bytes.
    ok(cli("topics", "alter-config", "table", "--set", "min.cleanable.dirty.ratio=1"))
    _produce(broker.bootstrap, "table", 40)
    checkpoint = _cleaner_checkpoint(broker.data_dir, "table")
    rolled = _rolled_segments(partition_dir)
    bases = [base for base, _ in rolled] + [max(int(p.name[:-4]) for p in partition_dir.glob("*.log"))]
    dirty = sum(size for (_, size), following in zip(rolled, bases[1:]) if following > checkpoint)
    total = sum(size for _, size in rolled)
    assert 0 < dirty < total
    assert ratios() == [("0", f"{dirty / total:.4f}"), ("1", "0.0000")]
