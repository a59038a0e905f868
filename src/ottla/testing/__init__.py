"""Run real Ottla brokers for tests and scripts: one (`broker`), or a ZooKeeper cluster (`cluster`).

`with ottla.testing.broker() as b: Producer({"bootstrap.servers": b.bootstrap})` starts
`ottla serve` as a subprocess on a free loopback port with a temporary data directory;
`with ottla.testing.cluster(brokers=3) as c:` starts ZooKeeper and three brokers joined
to it (`c.bootstrap` names them all). Each broker can be killed (-9), stopped, restarted
on the same port and data, and paused (SIGSTOP).
"""

from .broker import BrokerProcess, broker

__all__ = ["BrokerProcess", "broker", "Cluster", "cluster"]


def __getattr__(name: str):
    """`cluster` and `Cluster` on first use: the pytest plugin imports this package before
    Hypothesis's plugin loads, and the cluster harness pulls in kio, which builds Hypothesis
    strategies at import (pytest warned `HypothesisSideeffectWarning` on every run)."""
    if name in ("cluster", "Cluster"):
        from . import cluster_harness

        return getattr(cluster_harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
