"""`topics describe`, `cluster describe` and `cluster elect-leaders` on a single broker
(no ZooKeeper), run as users run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


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
