"""`python -m ottla.demo --brokers N`: which deployment the demo builds (the runs themselves start Spark
and are in tests/spark/test_demo.py; `--brokers 3` is run by hand, see docs/performance.md)."""

from __future__ import annotations

import pytest

from ottla.demo.brokers import ReplicatedCluster, SingleNode, deployment
from ottla.demo.run import parse_args


def test_default_is_a_single_broker_without_zookeeper(tmp_path):
    args = parse_args([])
    assert args.brokers == 1
    single = deployment(args.brokers, tmp_path)
    assert isinstance(single, SingleNode)
    assert single.replication == 1 and single.topic_config == {}


@pytest.mark.parametrize("count", ["3", "5"])
def test_three_or_more_brokers_replicate_three_times_with_two_in_sync(tmp_path, count):
    args = parse_args(["--brokers", count, "--events", "3000"])
    replicated = deployment(args.brokers, tmp_path)
    assert isinstance(replicated, ReplicatedCluster) and replicated.size == int(count)
    assert replicated.replication == 3 and replicated.topic_config == {"min.insync.replicas": "2"}


@pytest.mark.parametrize("count", ["0", "2", "-1", "three"])
def test_broker_counts_that_cannot_hold_three_replicas_are_refused(count, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--brokers", count])
    assert exit_info.value.code == 2
    assert "--brokers" in capsys.readouterr().err
