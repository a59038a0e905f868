"""The partition state machine (Kafka's `ZkPartitionStateMachine`).

NonExistent -> New (assignment known) -> Online (leader and ISR written) <-> Offline
(leader gone) -> NonExistent (topic deleted). Every leader change goes through one fenced,
version-conditional write of the partition state, the writes of one step sent together; a
write that finds another version (the leader changed its ISR meanwhile) re-reads the state
and elects again.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable, Iterable

from ..cluster.store import LeaderAndIsr, StaleVersion, TopicPartition
from . import elections
from .context import ControllerContext, PartitionPhase

log = logging.getLogger("ottla.controller")

_VALID_PREVIOUS = {
    PartitionPhase.NEW: {PartitionPhase.NON_EXISTENT},
    PartitionPhase.ONLINE: {PartitionPhase.NEW, PartitionPhase.ONLINE, PartitionPhase.OFFLINE},
    PartitionPhase.OFFLINE: {PartitionPhase.NEW, PartitionPhase.ONLINE, PartitionPhase.OFFLINE},
    PartitionPhase.NON_EXISTENT: {PartitionPhase.OFFLINE},
}
_MAX_RETRIES = 10


class ElectionFailed(Exception):
    """No replica may lead (with the reason Kafka logs)."""


class PartitionStateMachine:
    def __init__(self, ctx: ControllerContext, store, unclean_default: Callable[[], bool]):
        self.ctx = ctx
        self.store = store
        self.unclean_default = unclean_default  # the broker's unclean.leader.election.enable now (dynamic)

    def startup(self) -> None:
        """Phases from the partition states read at failover, then elect where needed."""
        ctx = self.ctx
        for tp in ctx.partitions():
            state = ctx.leadership.get(tp)
            if state is None:
                ctx.partition_phase[tp] = PartitionPhase.NEW
            elif ctx.is_online(state.leader, include_shutting_down=True):
                ctx.partition_phase[tp] = PartitionPhase.ONLINE
            else:
                ctx.partition_phase[tp] = PartitionPhase.OFFLINE
        self.trigger_online()

    def phase(self, tp: TopicPartition) -> PartitionPhase:
        return self.ctx.partition_phase.get(tp, PartitionPhase.NON_EXISTENT)

    def trigger_online(self) -> dict[TopicPartition, object]:
        """Elect leaders for every New or Offline partition not being deleted."""
        ctx = self.ctx
        candidates = [tp for tp in ctx.partitions()
                      if self.phase(tp) in (PartitionPhase.NEW, PartitionPhase.OFFLINE)
                      and tp[0] not in ctx.deleting]
        return self.handle(candidates, PartitionPhase.ONLINE, elections.OFFLINE)

    def trigger_unclean(self) -> dict[TopicPartition, object]:
        """Elect the Offline partitions whose topic now allows an unclean election: a config
        change set `unclean.leader.election.enable`, and Kafka's controller then elects at once
        (its TopicUncleanLeaderElectionEnable event) rather than at the next broker change."""
        ctx = self.ctx
        allowed: dict[str, bool] = {}
        candidates = []
        for tp in ctx.partitions():
            if self.phase(tp) is not PartitionPhase.OFFLINE or tp[0] in ctx.deleting:
                continue
            if tp[0] not in allowed:
                allowed[tp[0]] = self._unclean_allowed(tp, elections.OFFLINE)
            if allowed[tp[0]]:
                candidates.append(tp)
        return self.handle(candidates, PartitionPhase.ONLINE, elections.OFFLINE) if candidates else {}

    def handle(self, tps, target: PartitionPhase,
               strategy: elections.Strategy = elections.OFFLINE) -> dict[TopicPartition, object]:
        """Move partitions to `target`; returns, per partition, the new LeaderAndIsr or the
        exception that kept it where it was."""
        results: dict[TopicPartition, object] = {}
        valid = []
        for tp in tps:
            if self.phase(tp) not in _VALID_PREVIOUS[target]:
                results[tp] = ElectionFailed(f"invalid transition {self.phase(tp).value} -> {target.value}")
                log.warning("controller: partition %s-%d cannot move from %s to %s",
                            tp[0], tp[1], self.phase(tp).value, target.value)
            else:
                valid.append(tp)
        if target is PartitionPhase.NEW:
            for tp in valid:
                self.ctx.partition_phase[tp] = PartitionPhase.NEW
        elif target is PartitionPhase.OFFLINE:
            for tp in valid:
                self.ctx.partition_phase[tp] = PartitionPhase.OFFLINE
        elif target is PartitionPhase.NON_EXISTENT:
            for tp in valid:
                self.ctx.partition_phase.pop(tp, None)
                self.ctx.leadership.pop(tp, None)
        else:
            new = [tp for tp in valid if self.phase(tp) is PartitionPhase.NEW]
            results.update(self._initialize(new))
            results.update(self._elect([tp for tp in valid if tp not in new], strategy))
        self.ctx.flush()
        return results

    # -- New -> Online ---------------------------------------------------------------------
    def _initialize(self, tps) -> dict[TopicPartition, object]:
        """Leader: the first live replica; ISR: the live replicas; leader epoch 0."""
        ctx = self.ctx
        results: dict[TopicPartition, object] = {}
        planned: dict[TopicPartition, LeaderAndIsr] = {}
        for tp in tps:
            live = [r for r in ctx.replicas(tp) if ctx.is_online(r)]
            if not live:
                results[tp] = ElectionFailed(f"no replica of {tp[0]}-{tp[1]} is online")
                log.info("controller: cannot elect a leader for new partition %s-%d: no live replica", *tp)
                continue
            planned[tp] = LeaderAndIsr(live[0], 0, tuple(live), ctx.epoch.epoch)
        if not planned:
            return results
        try:
            created = self.store.create_partition_states(planned, ctx.epoch)
        except StaleVersion:
            # Some states exist already (a previous controller wrote them): one at a time.
            created, existed = {}, []
            for tp, state in planned.items():
                try:
                    created.update(self.store.create_partition_states({tp: state}, ctx.epoch))
                except StaleVersion:
                    existing = self.store.partition_states(tp[0]).get(tp[1])
                    if existing is not None:
                        ctx.leadership[tp] = existing
                        ctx.partition_phase[tp] = PartitionPhase.OFFLINE
                        existed.append(tp)
            results.update(self._elect(existed, elections.OFFLINE))
        for tp, state in created.items():
            ctx.leadership[tp] = state
            ctx.partition_phase[tp] = PartitionPhase.ONLINE
            ctx.send_leader_and_isr([r for r in ctx.replicas(tp) if ctx.is_online(r)], tp, is_new=True)
            results[tp] = state
        return results

    # -- Online/Offline -> Online ----------------------------------------------------------
    def _unclean_allowed(self, tp: TopicPartition, strategy: elections.Strategy) -> bool:
        if strategy.allow_unclean is not None:
            return strategy.allow_unclean
        value = self.store.topic_configs(tp[0]).get("unclean.leader.election.enable")
        if value is None:
            return self.unclean_default()
        return str(value).strip().lower() == "true"

    def _elect(self, tps, strategy: elections.Strategy) -> dict[TopicPartition, object]:
        """Elect a leader for each of `tps`. The writes go to the store together (pipelined on
        ZooKeeper, as Kafka's `updateLeaderAndIsr`), each conditional on its own partition's
        version; the partitions whose state changed meanwhile are re-read and elected again."""
        ctx = self.ctx
        results: dict[TopicPartition, object] = {}
        pending = list(tps)
        for _ in range(_MAX_RETRIES):
            proposals: dict[TopicPartition, LeaderAndIsr] = {}
            for tp in pending:
                outcome = self._propose(tp, strategy)
                if isinstance(outcome, LeaderAndIsr):
                    proposals[tp] = outcome
                else:
                    results[tp] = outcome
            if not proposals:
                return results
            stale = []
            for tp, written in self.store.update_partition_states(proposals, ctx.epoch).items():
                if isinstance(written, StaleVersion):
                    stale.append(tp)
                elif isinstance(written, Exception):
                    results[tp] = written
                else:
                    results[tp] = self._elected(tp, written, strategy)
            if not stale:
                return results
            self.refresh(stale)
            pending = stale
        for tp in pending:
            results[tp] = ElectionFailed(f"{tp[0]}-{tp[1]}: the state kept changing under the election")
        return results

    def _propose(self, tp: TopicPartition, strategy: elections.Strategy) -> LeaderAndIsr | ElectionFailed:
        """The state to write for `tp`'s election (at its current version), or why there is none."""
        ctx = self.ctx
        current = ctx.leadership.get(tp)
        if current is None:
            return ElectionFailed(f"no state for {tp[0]}-{tp[1]}")
        if current.controller_epoch > ctx.epoch.epoch:
            return ElectionFailed(f"{tp[0]}-{tp[1]} was written by a newer controller")
        replicas = ctx.replicas(tp)
        live = set(ctx.brokers)
        target = [r for r in replicas if r not in ctx.removing(tp)]
        chosen = elections.elect(strategy, replicas, current.isr, live, ctx.shutting_down,
                                 False, target)
        if chosen is None and strategy.name == "offline" and self._unclean_allowed(tp, strategy):
            chosen = elections.elect(strategy, replicas, current.isr, live, ctx.shutting_down, True)
            if chosen is not None:
                log.warning("controller: unclean leader election for %s-%d: %d leads, "
                            "records acknowledged by the old ISR may be lost", tp[0], tp[1], chosen[0])
        if chosen is None:
            if strategy.name == "offline":
                ctx.partition_phase[tp] = PartitionPhase.OFFLINE
            return ElectionFailed(f"no eligible leader for {tp[0]}-{tp[1]} "
                                  f"(replicas {list(replicas)}, isr {list(current.isr)})")
        leader, isr = chosen
        return LeaderAndIsr(leader, current.leader_epoch + 1, isr, ctx.epoch.epoch, current.version)

    def _elected(self, tp: TopicPartition, written: LeaderAndIsr, strategy: elections.Strategy) -> LeaderAndIsr:
        ctx = self.ctx
        ctx.leadership[tp] = written
        ctx.partition_phase[tp] = PartitionPhase.ONLINE
        include = strategy.name == "controlled_shutdown"
        ctx.send_leader_and_isr([r for r in ctx.replicas(tp) if ctx.is_online(r, include_shutting_down=include)], tp)
        log.info("controller: %s-%d leader %d epoch %d isr %s (%s election)",
                 tp[0], tp[1], written.leader, written.leader_epoch, list(written.isr), strategy.name)
        return written

    def bump_leader_epoch(self, tp: TopicPartition) -> LeaderAndIsr | None:
        """Same leader and ISR, next leader epoch: how a reassignment tells the replicas the
        replica set changed (followers re-fetch, fenced at the old epoch)."""
        ctx = self.ctx
        for _ in range(_MAX_RETRIES):
            current = ctx.leadership.get(tp)
            if current is None or current.controller_epoch > ctx.epoch.epoch:
                return None
            proposed = LeaderAndIsr(current.leader, current.leader_epoch + 1, current.isr,
                                    ctx.epoch.epoch, current.version)
            try:
                written = self.store.update_partition_state(tp, proposed, ctx.epoch)
            except StaleVersion:
                self.refresh([tp])
                continue
            ctx.leadership[tp] = written
            return written
        return None

    def refresh(self, tps: Iterable[TopicPartition]) -> None:
        """Re-read partitions' states (another writer, a leader changing its ISR, won): one read
        of each topic's states, however many of its partitions changed (a broker rejoining the
        ISR of 1,000 partitions announces 1,000 changes)."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in tps:
            by_topic[topic].append(partition)
        for topic, partitions in by_topic.items():
            states = self.store.partition_states(topic)
            for partition in partitions:
                if (state := states.get(partition)) is not None:
                    self.ctx.leadership[(topic, partition)] = state
