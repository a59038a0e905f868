"""pytest fixtures for real brokers: `ottla_broker` (fresh per test), `ottla_broker_factory`,
and `ottla_cluster` (ZooKeeper and three brokers)."""

from __future__ import annotations

import pytest

from . import BrokerProcess


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
def ottla_cluster(tmp_path):
    """ZooKeeper and three brokers (ids 1-3) joined to it; `.bootstrap`, `.brokers[id]`."""
    from .cluster_harness import cluster

    with cluster(brokers=3, root=tmp_path) as handle:
        yield handle
