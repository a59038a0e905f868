"""A failover's LeaderAndIsr on one broker, in-process: how long it holds the event loop.

Broker 1 of 3 holds one topic of --partitions partitions (RF 3, real logs in a temporary data
dir, leaders spread over the three brokers, broker 1 following the others' partitions through a
real replica fetcher manager whose leaders do not answer). Broker 3 dies; broker 1 applies the
two LeaderAndIsr a ZooKeeper controller sends, each for every partition: the ISR shrink (new
leader epochs, leader -1 for broker 3's partitions) and the elections (broker 3's partitions
led by 1 or 2), with the metadata cache updated as the controller link does. Per request: wall
clock, CPU of this thread, the longest single step of the request (`loop_lag.timed`, CPU), and
the longest the loop could not run anything else (a probe task's longest gap between two 1 ms
sleeps, wall clock: what every other client of the broker waited at most), and how long the
disk worker then took to finish what the request left it (new leaders' epoch checkpoints, once
they were no longer written before leading).
Before the sliced path existed (`ReplicaManager.apply_in_slices`) the whole request was one step.

    PYTHONPATH=src python benchmarks/leader_and_isr.py [--partitions 1000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from ottla.config import BrokerConfig
from ottla.log.disk_worker import DiskWorker
from ottla.log.manager import LogManager
from ottla.server.interbroker import InterBrokerClient
from ottla.server.loop_lag import timed
from ottla.server.metadata_cache import BrokerInfo, MetadataCache, PartitionState
from ottla.server.replica_fetcher import ReplicaFetcherManager
from ottla.server.replica_manager import ReplicaManager


def state(p: int, leader: int, epoch: int, isr: tuple[int, ...]) -> PartitionState:
    replicas = tuple((p + k) % 3 + 1 for k in range(3))
    return PartitionState("big", p, leader, epoch, replicas, isr, (), 1, epoch)


async def failover(root: Path, partitions: int) -> list[tuple[str, float, float, float, float]]:
    config = BrokerConfig({})
    logs = LogManager(root, config, disk_worker=DiskWorker())  # as `ottla serve` has
    topic_id = uuid.uuid4()
    logs.create_topic("big", partitions, {}, topic_id=topic_id)
    metadata = MetadataCache(1, "bench")
    initial = [state(p, p % 3 + 1, 0, (1, 2, 3)) for p in range(partitions)]
    # Port 1 on loopback: the fetchers' leaders refuse connections and back off.
    metadata.update(controller_id=3, controller_epoch=1, brokers=[BrokerInfo(i, "127.0.0.1", 1) for i in (1, 2, 3)],
                    partition_states=initial, topic_ids={"big": topic_id})
    manager = ReplicaManager(1, logs, metadata)
    client = InterBrokerClient("bench")
    manager.fetchers = ReplicaFetcherManager(SimpleNamespace(config=config, metadata=metadata, node_id=1), client)
    manager.apply_partition_states(initial)
    shrink = [state(p, -1 if p % 3 == 2 else p % 3 + 1, 1, (1, 2)) for p in range(partitions)]
    moved = [state(p, (1 if p % 2 else 2) if p % 3 == 2 else p % 3 + 1, 2, (1, 2)) for p in range(partitions)]
    rows = []
    gaps = [0.0]

    async def probe() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps[0], last = max(gaps[0], now - last - 0.001), now

    prober = asyncio.get_running_loop().create_task(probe())
    await asyncio.sleep(0.01)
    for name, states in (("ISR shrink (broker 3 gone)", shrink), ("its leaders elected", moved)):
        wall, cpu, gaps[0] = time.perf_counter(), time.thread_time(), 0.0
        if hasattr(manager, "apply_in_slices"):
            step = timed(manager.apply_in_slices(states, 0, lambda part, _: metadata.update_from_leader_and_isr(part)),
                         lambda: name)
        else:  # the code before slicing: one step
            async def whole():
                manager.apply_partition_states(states)
                metadata.update_from_leader_and_isr(states)
            step = timed(whole(), lambda: name)
        await step
        wall, cpu = (time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000
        await asyncio.sleep(0.01)  # the probe's first wake-up after the request ends measures its last step
        stalled = gaps[0] * 1000
        drained = time.perf_counter()
        logs.disk_worker.drain()  # holds the loop, between the requests measured
        rows.append((name, wall, cpu, step.longest * 1000, stalled, (time.perf_counter() - drained) * 1000))
        await asyncio.sleep(0.01)  # the probe's late wake-up is not the next request's
    prober.cancel()
    await manager.fetchers.stop()
    await client.close()
    manager.close()
    logs.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"| LeaderAndIsr, {args.partitions:,} partitions, broker 1 of 3 | wall ms | CPU ms | longest step, ms of CPU "
          "| loop stalled, ms wall | disk worker after it, ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for _ in range(args.repeat):
        root = Path(tempfile.mkdtemp(prefix="ottla-bench-lai-"))
        try:
            for name, wall, cpu, longest, stalled, after in asyncio.run(failover(root, args.partitions)):
                print(f"| {name} | {wall:,.0f} | {cpu:,.0f} | {longest:,.0f} | {stalled:,.0f} | {after:,.0f} |", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
