"""A leader's ISR changes, written to ZooKeeper (Kafka's ZooKeeper-mode `Partition.updateIsr`
and the isr-expiration / isr-change-propagation tasks).

The replica manager proposes: a shrink from the periodic check (every
`replica.lag.time.max.ms` / 2, as Kafka schedules it), an expansion when a follower's fetch
reaches the HW. Each proposal is written to `/brokers/topics/<t>/partitions/<p>/state`
conditionally on the state version the leader last saw (a controller that moved leadership
meanwhile wins: the write gets StaleVersion and the leader keeps its ISR until the next
LeaderAndIsr), then announced under `/isr_change_notification` so the controller sends
UpdateMetadata. One writer task does both off the event loop, for every proposal made while
its previous round was out: the states pipelined, then one notification listing them all.
Kafka batches its notifications too (ReplicaManager.maybePropagateIsrChanges), but waits for
5 s without changes: a restarted follower rejoining 1,000 partitions wrote 1,000 notification
znodes, which the controller read and deleted one by one (10 s). One write per partition is
in flight (`LeaderState` proposes nothing else meanwhile).
"""

from __future__ import annotations

import asyncio
import logging

from ..cluster.store import LeaderAndIsr, StoreError, TopicPartition
from .clock import now_ms
from .partition import Partition

__all__ = ["IsrUpdates"]

log = logging.getLogger("ottla.replica")

NOTIFY_RETRY_S = 1.0


class IsrUpdates:
    def __init__(self, replicas, store):
        self._replicas = replicas
        self._store = store
        self._interval_s = replicas.lag_time_max_ms / 2000
        self._checker: asyncio.Task | None = None
        self._writer: asyncio.Task | None = None
        self._wake = asyncio.Event()
        # Proposals not yet written, and partitions written but not yet announced.
        self._proposed: dict[TopicPartition, tuple[Partition, frozenset[int], LeaderAndIsr]] = {}
        self._unannounced: set[TopicPartition] = set()

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
        state = LeaderAndIsr(partition.node_id, partition.leader_epoch, tuple(sorted(isr)),
                             partition.controller_epoch, partition.zk_version)
        self._proposed[(partition.topic, partition.index)] = (partition, isr, state)
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_rounds())

    async def _write_rounds(self) -> None:
        while self._proposed or self._unannounced:
            self._wake.clear()
            proposed, self._proposed = self._proposed, {}
            if proposed:
                await self._write(proposed)
            if self._unannounced:
                announced = set(self._unannounced)
                try:
                    await asyncio.to_thread(self._store.notify_isr_change, announced)
                    self._unannounced -= announced
                except Exception as exc:
                    log.warning("announcing ISR changes of %d partitions failed (%s); retrying", len(announced), exc)
                    await self._wait_for_more(NOTIFY_RETRY_S)

    async def _wait_for_more(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _write(self, proposed: dict[TopicPartition, tuple[Partition, frozenset[int], LeaderAndIsr]]) -> None:
        states = {key: state for key, (_, _, state) in proposed.items()}
        try:
            outcomes = await asyncio.to_thread(self._store.update_partition_states, states, None)
        except Exception as exc:
            log.warning("ISR changes of %d partitions failed (%s)", len(proposed), exc)
            outcomes = {key: exc for key in proposed}
        for key, (partition, isr, state) in proposed.items():
            written = outcomes.get(key)
            if not isinstance(written, LeaderAndIsr):
                if isinstance(written, StoreError):
                    log.info("ISR change of %s-%d to %s refused (%s): waiting for the controller's next LeaderAndIsr",
                             *key, sorted(isr), type(written).__name__)
                partition.isr_change_failed()
                continue
            self._unannounced.add(key)
            if self._replicas.partitions.get(key) is not partition or not partition.is_leader \
                    or partition.leader_epoch != state.leader_epoch:
                continue  # leadership moved while writing: the controller's state is what counts
            log.info("ISR of %s-%d is now %s (leader epoch %d)", *key, sorted(isr), state.leader_epoch)
            if partition.isr_committed(isr, written.version):
                self._replicas.high_watermark_moved(*key)

    async def stop(self) -> None:
        self._replicas.isr_updates = None
        tasks = [t for t in (self._checker, self._writer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
