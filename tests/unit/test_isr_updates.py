"""A leader's ISR expansions, written to the cluster store by `IsrUpdates` (real logs, the
in-memory store with ZooKeeper's semantics)."""

from __future__ import annotations

import asyncio

from ottla.cluster.memory_store import MemoryZooKeeper
from ottla.cluster.store import LeaderAndIsr
from ottla.config import BrokerConfig
from ottla.log.manager import LogManager
from ottla.records.records import Record, build_batch
from ottla.server.clock import now_ms
from ottla.server.isr_updates import IsrUpdates
from ottla.server.metadata_cache import PartitionState
from ottla.server.replica_manager import ReplicaManager

PARTITIONS = 20


def test_followers_caught_up_together_rejoin_with_one_notification_and_no_timer(tmp_path):
    """A restarted follower catches up on many partitions in one fetch: each partition's ISR is
    written (conditionally) at once, without waiting for the periodic ISR check, and the
    controller is told with one `/isr_change_notification` for all of them, not one each
    (1,000 notifications took the controller 10 s to read and delete one by one)."""
    zk = MemoryZooKeeper()
    store = zk.session()
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("t", PARTITIONS, {})
    manager = ReplicaManager(1, logs)
    for p in range(PARTITIONS):
        zk.states[("t", p)] = LeaderAndIsr(1, 4, (1,), 1, 7)

    async def scenario():
        updates = IsrUpdates(manager, store)
        updates.start()
        try:
            manager.apply_partition_states([PartitionState("t", p, 1, 4, (1, 2), (1,), zk_version=7, controller_epoch=1)
                                            for p in range(PARTITIONS)], now_ms=now_ms())
            for p in range(PARTITIONS):
                manager.append("t", p, build_batch([Record(b"k", b"v")] * 2), now_ms=now_ms())
            for p in range(PARTITIONS):  # the follower's fetch at the leaders' log end
                manager.follower_fetched("t", p, 2, 2, now_ms())
            while any(manager.get_partition("t", p).isr != {1, 2} for p in range(PARTITIONS)) or not zk.isr_changes:
                await asyncio.sleep(0.01)
        finally:
            await updates.stop()

    try:
        asyncio.run(scenario())
    finally:
        logs.close()
    assert {tp: (s.isr, s.leader_epoch, s.version) for tp, s in zk.states.items()} == {
        ("t", p): ((1, 2), 4, 8) for p in range(PARTITIONS)}
    assert zk.isr_changes == [{("t", p) for p in range(PARTITIONS)}]
