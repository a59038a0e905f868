"""A follower's fetcher sends one request at a time to its leader. When one of its partitions
waits for a retry (its leader answered UNKNOWN_LEADER_EPOCH: the controller's LeaderAndIsr
reached the follower first), the fetch of the others must not long-poll past that retry: after
a controlled shutdown moved a leadership, the retry waited for a 500 ms empty long poll, and
acks=all on that partition with it (benchmarks/failover.py, docs/performance.md).

In process, two real brokers' replica managers and logs; the follower fetches over a real
socket with `replica.fetch.wait.max.ms` of two minutes, so a retry held behind the long poll
never comes within the test's guard (`ANSWERED`, against a hang, not a speed assertion)."""

from __future__ import annotations

import asyncio
import contextlib

from ottla.config import BrokerConfig
from ottla.records.records import Record, build_batch
from ottla.replication.follower import FetchPhase
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.interbroker import InterBrokerClient
from ottla.server.metadata_cache import PartitionState
from ottla.server.replica_fetcher import ReplicaFetcherManager

LEADER, FOLLOWER = 1, 2
ANSWERED = 30.0
LONG_POLL_MS = 120_000


def _states(leader_epochs: dict[int, int]) -> list[PartitionState]:
    return [PartitionState("t", p, LEADER, epoch, (LEADER, FOLLOWER), (LEADER, FOLLOWER))
            for p, epoch in leader_epochs.items()]


@contextlib.asynccontextmanager
async def _leader_and_follower(tmp_path):
    """A started leader and a follower whose fetcher long-polls for two minutes, both with
    topic `t` of two partitions."""
    leader = Broker(tmp_path / "leader", BrokerConfig({"node.id": LEADER}), port=0)
    follower = Broker(tmp_path / "follower",
                      BrokerConfig({"node.id": FOLLOWER, "replica.fetch.wait.max.ms": LONG_POLL_MS}))
    manager = ReplicaFetcherManager(follower, InterBrokerClient("test"))
    await leader.start()
    try:
        leader.create_topic("t", 2, {})
        follower.create_topic("t", 2, {})
        yield leader, follower, manager
    finally:
        await manager.stop()
        await manager.client.close()
        await leader.stop()
        follower.replicas.close()
        follower.logs.close()
        follower.release_data_dir()


def test_a_partition_retrying_an_unknown_leader_epoch_is_not_held_behind_the_others_long_poll(tmp_path):
    async def scenario():
        async with _leader_and_follower(tmp_path) as (leader, follower, manager):
            leader.replicas.apply_partition_states(_states({0: 1, 1: 1}))
            manager.learn_endpoints({LEADER: (leader.host, leader.port)})
            follower.replicas.fetchers = manager
            # Partition 1's LeaderAndIsr reached the follower before its leader: epoch 2 is
            # unknown there, partition 0 has nothing new and long-polls.
            follower.replicas.apply_partition_states(_states({0: 1, 1: 2}))
            fetcher = manager._fetchers[LEADER]
            retrying = fetcher.states[("t", 1)]
            async with asyncio.timeout(ANSWERED):
                while not retrying._unknown_epoch_answers:
                    await asyncio.sleep(0.005)
                while not leader.replicas.delayed_fetches.watching(("t", 0)):
                    await asyncio.sleep(0.005)  # the fetch of partition 0 alone waits on the leader
            leader.replicas.apply_partition_states(_states({1: 2}))
            leader.replicas.append("t", 1, build_batch([Record(None, b"after the move")]), now_ms=now_ms())
            copied = follower.logs.get_log("t", 1)
            async with asyncio.timeout(ANSWERED):
                while copied.log_end_offset < 1:
                    await asyncio.sleep(0.005)
            assert retrying.phase is FetchPhase.FETCHING

    asyncio.run(scenario())


def test_a_fenced_partition_whose_leader_and_isr_comes_is_not_held_behind_the_others_long_poll(tmp_path):
    async def scenario():
        async with _leader_and_follower(tmp_path) as (leader, follower, manager):
            # The controller moved partition 1 to epoch 2 (an ISR change bumps it); the leader
            # applied it, the follower not yet: its fetch is fenced, partition 0's long-polls.
            leader.replicas.apply_partition_states(_states({0: 1, 1: 2}))
            manager.learn_endpoints({LEADER: (leader.host, leader.port)})
            follower.replicas.fetchers = manager
            follower.replicas.apply_partition_states(_states({0: 1, 1: 1}))
            fetcher = manager._fetchers[LEADER]
            async with asyncio.timeout(ANSWERED):
                while fetcher.states[("t", 1)].phase is not FetchPhase.FENCED:
                    await asyncio.sleep(0.005)
                while not leader.replicas.delayed_fetches.watching(("t", 0)):
                    await asyncio.sleep(0.005)
            follower.replicas.apply_partition_states(_states({1: 2}))  # its LeaderAndIsr comes
            leader.replicas.append("t", 1, build_batch([Record(None, b"after the fence")]), now_ms=now_ms())
            copied = follower.logs.get_log("t", 1)
            async with asyncio.timeout(ANSWERED):
                while copied.log_end_offset < 1:
                    await asyncio.sleep(0.005)

    asyncio.run(scenario())
