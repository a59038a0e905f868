"""Partition reassignment (KIP-455, as Kafka's ZooKeeper controller runs it).

With ORS the original replicas and TRS the target: phase A writes RS = TRS + ORS with
adding (TRS - ORS) and removing (ORS - TRS) replicas, bumps the leader epoch and starts
the new replicas; once every target replica is in the ISR (the leader announces ISR
changes), phase B makes TRS the assignment, moves leadership into TRS if needed, and
stops and deletes the removed replicas. A new target for a partition under reassignment
replaces the old one; cancelling (no target) goes back to ORS.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Mapping

from ..cluster.store import TopicPartition
from ..errors import ErrorCode
from . import elections
from .context import ControllerContext, PartitionPhase, ReplicaPhase
from .partitions import PartitionStateMachine
from .replicas import ReplicaStateMachine

log = logging.getLogger("ottla.controller")
P = ReplicaPhase


def _dedupe(ids) -> tuple[int, ...]:
    return tuple(dict.fromkeys(ids))


class ReassignmentManager:
    def __init__(self, ctx: ControllerContext, store, partitions: PartitionStateMachine,
                 replicas: ReplicaStateMachine):
        self.ctx = ctx
        self.store = store
        self.partitions = partitions
        self.replicas = replicas
        self.from_store: set[TopicPartition] = set()  # requested through /admin/reassign_partitions

    def in_progress(self) -> dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """ListPartitionReassignments: partition -> (replicas, adding, removing)."""
        ctx = self.ctx
        return {tp: (ctx.replicas(tp), ctx.adding(tp), ctx.removing(tp))
                for tp in ctx.partitions() if ctx.adding(tp) or ctx.removing(tp)}

    def validate(self, tp: TopicPartition, target: tuple[int, ...] | None,
                 allow_rf_change: bool = True) -> tuple[ErrorCode, str | None]:
        ctx = self.ctx
        if tp[0] not in ctx.topics or tp[1] not in ctx.topics[tp[0]].partitions or tp[0] in ctx.deleting:
            return ErrorCode.unknown_topic_or_partition, "The partition does not exist."
        if target is None:
            if not (ctx.adding(tp) or ctx.removing(tp)):
                return ErrorCode.no_reassignment_in_progress, "The partition is not being reassigned."
            return ErrorCode.none, None
        if not target:
            return ErrorCode.invalid_replica_assignment, "Empty replica list specified in partition reassignment."
        if len(set(target)) != len(target):
            return ErrorCode.invalid_replica_assignment, \
                f"Duplicate replica ids in partition reassignment replica list: {list(target)}"
        if any(r < 0 for r in target):
            return ErrorCode.invalid_replica_assignment, f"Invalid broker id in replica list: {list(target)}"
        original = self._original(tp)
        adding = [r for r in target if r not in original]
        if not set(adding) <= ctx.live_ids():
            return ErrorCode.invalid_replica_assignment, \
                f"Replica assignment has brokers that are not alive. Replica list: {adding}, " \
                f"live broker list: {sorted(ctx.live_ids())}"
        if not allow_rf_change:
            # KIP-860: the size of the set the partition is headed for (an ongoing reassignment's target).
            heading = len([r for r in ctx.replicas(tp) if r not in ctx.removing(tp)])
            if heading != len(target):
                return ErrorCode.invalid_replication_factor, \
                    f"The replication factor is changed from {heading} to {len(target)}"
        return ErrorCode.none, None

    def alter(self, targets: Mapping[TopicPartition, tuple[int, ...] | None], from_store: bool = False,
              allow_rf_change: bool = True) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        results = {}
        for tp, target in targets.items():
            error, message = self.validate(tp, target, allow_rf_change)
            results[tp] = (error, message)
            if error != ErrorCode.none:
                continue
            if from_store:
                self.from_store.add(tp)
            self._reassign(tp, self._original(tp) if target is None else tuple(target))
        return results

    def _original(self, tp: TopicPartition) -> tuple[int, ...]:
        adding = self.ctx.adding(tp)
        return tuple(r for r in self.ctx.replicas(tp) if r not in adding)

    def _set_assignment(self, tp: TopicPartition, replicas, adding, removing) -> None:
        ctx = self.ctx
        current = ctx.topics[tp[0]]
        partitions = dict(current.partitions)
        partitions[tp[1]] = tuple(replicas)
        add = {p: r for p, r in current.adding_replicas.items() if p != tp[1]}
        rem = {p: r for p, r in current.removing_replicas.items() if p != tp[1]}
        if adding:
            add[tp[1]] = tuple(adding)
        if removing:
            rem[tp[1]] = tuple(removing)
        updated = dataclasses.replace(current, partitions=partitions, adding_replicas=add, removing_replicas=rem)
        self.store.set_assignment(updated, ctx.epoch)
        ctx.topics[tp[0]] = updated

    def _retire(self, tp: TopicPartition, broker_ids) -> None:
        """Stop and delete replicas leaving the partition (Kafka does not wait for the answer)."""
        gone = [(tp, b) for b in broker_ids]
        for replica in gone:
            self.ctx.replica_phase.setdefault(replica, P.ONLINE)
        self.replicas.handle(gone, P.OFFLINE)
        self.replicas.handle(gone, P.DELETION_STARTED)
        self.replicas.handle(gone, P.DELETION_SUCCESSFUL)
        self.replicas.handle(gone, P.NON_EXISTENT)

    def _reassign(self, tp: TopicPartition, target: tuple[int, ...]) -> None:
        ctx = self.ctx
        previous_adding = ctx.adding(tp)
        original = self._original(tp)
        full = _dedupe(list(target) + list(original))
        adding = tuple(r for r in full if r not in original)
        removing = tuple(r for r in full if r not in target)
        # A: the union becomes the assignment; replicas that an older target was adding and
        # this one does not want go away; the new ones start as followers.
        self._set_assignment(tp, full, adding, removing)
        self._retire(tp, [r for r in previous_adding if r not in full])
        if self.partitions.bump_leader_epoch(tp) is not None:
            ctx.send_leader_and_isr([r for r in full if ctx.is_online(r, True)], tp)
        self.replicas.handle([(tp, r) for r in adding if self.replicas.phase((tp, r)) is P.NON_EXISTENT], P.NEW)
        log.info("controller: reassigning %s-%d from %s to %s", tp[0], tp[1], list(original), list(target))
        self.maybe_complete(tp, started=True)

    def maybe_complete(self, tp: TopicPartition, started: bool = False) -> bool:
        """Phase B, once every target replica is in the ISR."""
        ctx = self.ctx
        adding, removing = ctx.adding(tp), ctx.removing(tp)
        if not (started or adding or removing):
            return False
        state = ctx.leadership.get(tp)
        target = tuple(r for r in ctx.replicas(tp) if r not in removing)
        if state is None or not set(target) <= set(state.isr):
            return False
        self.replicas.handle([(tp, r) for r in adding], P.ONLINE)
        self._set_assignment(tp, target, (), ())
        if state.leader not in target or not ctx.is_online(state.leader):
            self.partitions.handle([tp], PartitionPhase.ONLINE, elections.REASSIGN)
        elif self.partitions.bump_leader_epoch(tp) is not None:
            ctx.send_leader_and_isr([r for r in target if ctx.is_online(r, True)], tp)
        self._retire(tp, removing)
        if tp in self.from_store:
            self.from_store.discard(tp)
            self.store.clear_reassignment({tp}, ctx.epoch)
        ctx.send_update_metadata(ctx.brokers, [tp])
        log.info("controller: reassignment of %s-%d complete: %s", tp[0], tp[1], list(target))
        return True

    def resume(self, broker_ids: set[int] | None = None) -> None:
        """At failover (all) or when brokers return (those touching them): carry on."""
        ctx = self.ctx
        for tp in list(ctx.partitions()):
            adding, removing = ctx.adding(tp), ctx.removing(tp)
            if not (adding or removing):
                continue
            target = tuple(r for r in ctx.replicas(tp) if r not in removing)
            if broker_ids is None or set(target) & broker_ids:
                self._reassign(tp, target)
