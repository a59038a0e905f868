"""A leader's ISR changes, written to ZooKeeper (Kafka's ZooKeeper-mode `Partition.updateIsr`
and the isr-expiration / isr-change-propagation tasks).

The replica manager proposes: a shrink from the periodic check (every
`replica.lag.time.max.ms` / 2, as Kafka schedules it), an expansion when a follower's fetch
reaches the HW. Each proposal is written to `/brokers/topics/<t>/partitions/<p>/state`
conditionally on the state version the leader last saw (a controller that moved leadership
meanwhile wins: the write gets StaleVersion and the leader keeps its ISR until the next
LeaderAndIsr), then announced under `/isr_change_notification` so the controller sends
UpdateMetadata. Store calls run off the event loop; one write per partition is in flight
(`LeaderState` proposes nothing else meanwhile).
"""

from __future__ import annotations

import asyncio
import logging

from ..cluster.store import LeaderAndIsr, StoreError, TopicPartition
from .clock import now_ms
from .partition import Partition

__all__ = ["IsrUpdates"]

log = logging.getLogger("ottla.replica")


class IsrUpdates:
    def __init__(self, replicas, store):
        self._replicas = replicas
        self._store = store
        self._interval_s = replicas.lag_time_max_ms / 2000
        self._tasks: set[asyncio.Task] = set()
        self._checker: asyncio.Task | None = None

    def start(self) -> None:
        self._replicas.isr_updates = self
        self._checker = asyncio.get_running_loop().create_task(self._check_periodically())

    async def _check_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self._replicas.propose_isr_shrinks(now_ms())
            except Exception:
                log.exception("ISR check failed; retrying")

    def propose(self, partition: Partition, isr: frozenset[int]) -> None:
        task = asyncio.get_running_loop().create_task(self._write(partition, isr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, partition: Partition, isr: frozenset[int]) -> None:
        key: TopicPartition = (partition.topic, partition.index)
        epoch = partition.leader_epoch
        state = LeaderAndIsr(partition.node_id, epoch, tuple(sorted(isr)), partition.controller_epoch,
                             partition.zk_version)
        try:
            written = await asyncio.to_thread(self._write_and_notify, key, state)
        except StoreError as exc:
            log.info("ISR change of %s-%d to %s refused (%s): waiting for the controller's next LeaderAndIsr",
                     *key, sorted(isr), type(exc).__name__)
            partition.isr_change_failed()
            return
        except Exception:
            log.exception("ISR change of %s-%d to %s failed", *key, sorted(isr))
            partition.isr_change_failed()
            return
        if self._replicas.partitions.get(key) is not partition or not partition.is_leader \
                or partition.leader_epoch != epoch:
            return  # leadership moved while writing: the controller's state is what counts
        log.info("ISR of %s-%d is now %s (leader epoch %d)", *key, sorted(isr), epoch)
        if partition.isr_committed(isr, written.version):
            self._replicas.high_watermark_moved(*key)

    def _write_and_notify(self, key: TopicPartition, state: LeaderAndIsr) -> LeaderAndIsr:
        written = self._store.update_partition_state(key, state, None)
        self._store.notify_isr_change({key})
        return written

    async def stop(self) -> None:
        self._replicas.isr_updates = None
        tasks = list(self._tasks) + ([self._checker] if self._checker is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
