"""pytest fixtures for real brokers: `ottla_broker` (fresh per test), `ottla_broker_factory`,
`ottla_cluster` (ZooKeeper and three brokers) and `ottla_cluster_factory`."""

from __future__ import annotations

import contextlib

import pytest

from .broker import BrokerProcess


@pytest.fixture
def ottla_broker_factory(tmp_path):
    """Call with a config mapping to start brokers; all are stopped after the test."""
    started: list[BrokerProcess] = []

    def start(config=None, *, name: str = "broker", **kwargs) -> BrokerProcess:
        handle = BrokerProcess(tmp_path / f"{name}-{len(started)}", config, **kwargs)
        started.append(handle)
        return handle.start()

    yield start
    for handle in started:
        try:
            handle.stop()
        except RuntimeError:
            handle.kill()


@pytest.fixture
def ottla_broker(ottla_broker_factory) -> BrokerProcess:
    """A running broker with default settings; `.bootstrap` is its address."""
    return ottla_broker_factory()


@pytest.fixture
def ottla_cluster_factory(tmp_path):
    """Call as `ottla_cluster_factory(brokers=3, config=None, zookeeper_nodes=1, ...)` (the
    arguments of `ottla.testing.cluster`); every cluster started is torn down after the test."""
    from .cluster_harness import cluster

    with contextlib.ExitStack() as stack:
        started = []

        def start(brokers: int = 3, config=None, **kwargs):
            root = tmp_path / f"cluster-{len(started)}"
            started.append(stack.enter_context(cluster(brokers, config, root=root, **kwargs)))
            return started[-1]
        yield start


@pytest.fixture
def ottla_cluster(ottla_cluster_factory):
    """ZooKeeper and three brokers (ids 1-3) joined to it; `.bootstrap`, `.brokers[id]`."""
    return ottla_cluster_factory(brokers=3)
