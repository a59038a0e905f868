"""The replica state machine (Kafka's `ZkReplicaStateMachine`), one state per (partition, broker).

NewReplica and OnlineReplica tell the broker its role (LeaderAndIsr); OfflineReplica stops
it (StopReplica without delete) and takes it out of the ISR, leaving the last ISR member in
place so a clean election later knows whose log is complete; ReplicaDeletionStarted asks
the broker to delete its copy, and the answer moves it to ReplicaDeletionSuccessful or
ReplicaDeletionIneligible (retried when the broker is back).
"""

from __future__ import annotations

import logging

from ..cluster.store import NO_LEADER, LeaderAndIsr, StaleVersion, TopicPartition
from .context import ControllerContext, Replica, ReplicaPhase
from .requests import LEADER_EPOCH_DURING_DELETE

log = logging.getLogger("ottla.controller")

P = ReplicaPhase
_VALID_PREVIOUS = {
    P.NEW: {P.NON_EXISTENT},
    P.ONLINE: {P.NEW, P.ONLINE, P.OFFLINE, P.DELETION_INELIGIBLE},
    P.OFFLINE: {P.NEW, P.ONLINE, P.OFFLINE, P.DELETION_INELIGIBLE},
    P.DELETION_STARTED: {P.OFFLINE},
    P.DELETION_SUCCESSFUL: {P.DELETION_STARTED},
    P.DELETION_INELIGIBLE: {P.OFFLINE, P.DELETION_STARTED},
    P.NON_EXISTENT: {P.DELETION_SUCCESSFUL},
}
_MAX_RETRIES = 10


class ReplicaStateMachine:
    def __init__(self, ctx: ControllerContext, store):
        self.ctx = ctx
        self.store = store

    def startup(self) -> None:
        """Replicas on live brokers become Online (and hear their role); the others are
        ReplicaDeletionIneligible, then Offline (out of the ISR) unless their topic is being
        deleted, as Kafka's `ZkReplicaStateMachine.startup`: a broker that died with the
        previous controller leaves the ISR as if this one had seen it die."""
        ctx = self.ctx
        online, offline = [], []
        for tp in ctx.partitions():
            for broker_id in ctx.replicas(tp):
                if ctx.is_online(broker_id, include_shutting_down=True):
                    ctx.replica_phase[(tp, broker_id)] = P.ONLINE
                    online.append((tp, broker_id))
                else:
                    ctx.replica_phase[(tp, broker_id)] = P.DELETION_INELIGIBLE
                    if tp[0] not in ctx.deleting:
                        offline.append((tp, broker_id))
        self.handle(online, P.ONLINE)
        self.handle(offline, P.OFFLINE)

    def phase(self, replica: Replica) -> ReplicaPhase:
        return self.ctx.replica_phase.get(replica, P.NON_EXISTENT)

    def in_phase(self, topic: str, phase: ReplicaPhase) -> list[Replica]:
        return [r for r, p in self.ctx.replica_phase.items() if r[0][0] == topic and p is phase]

    def handle(self, replicas, target: ReplicaPhase) -> None:
        ctx = self.ctx
        valid = []
        for replica in replicas:
            if self.phase(replica) in _VALID_PREVIOUS[target]:
                valid.append(replica)
            else:
                log.warning("controller: replica %d of %s-%d cannot move from %s to %s", replica[1],
                            replica[0][0], replica[0][1], self.phase(replica).value, target.value)
        if target is P.OFFLINE:
            self._offline(valid)
            ctx.flush()
            return
        for tp, broker_id in valid:
            if target is P.NEW:
                if ctx.leader(tp) != broker_id:
                    ctx.send_leader_and_isr([broker_id], tp, is_new=True)
            elif target is P.ONLINE:
                if self.phase((tp, broker_id)) is not P.NEW:
                    ctx.send_leader_and_isr([broker_id], tp)
            elif target is P.DELETION_STARTED:
                ctx.batch.add_stop_replica([broker_id], tp, LEADER_EPOCH_DURING_DELETE, delete=True)
            if target is P.NON_EXISTENT:
                ctx.replica_phase.pop((tp, broker_id), None)
            else:
                ctx.replica_phase[(tp, broker_id)] = target
        ctx.flush()

    def _offline(self, replicas) -> None:
        ctx = self.ctx
        leaving: dict[TopicPartition, list[int]] = {}
        for tp, broker_id in replicas:
            state = ctx.leadership.get(tp)
            ctx.batch.add_stop_replica([broker_id], tp, state.leader_epoch if state else -1, delete=False)
            if state is not None and tp[0] not in ctx.deleting:
                leaving.setdefault(tp, []).append(broker_id)
            ctx.replica_phase[(tp, broker_id)] = P.OFFLINE
        for tp, written in self.remove_from_isr(leaving).items():
            ctx.send_leader_and_isr([r for r in ctx.replicas(tp) if r not in leaving[tp] and ctx.is_online(r, True)], tp)

    def remove_from_isr(self, leaving: dict[TopicPartition, list[int]]) -> dict[TopicPartition, LeaderAndIsr]:
        """Take the brokers out of each partition's ISR (and out of leadership: the leader
        becomes -1), keeping the last ISR member; the writes go to the store together, each
        conditional on its partition's version. Returns the states written (none where there
        was nothing to change)."""
        ctx = self.ctx
        done: dict[TopicPartition, LeaderAndIsr] = {}
        pending = list(leaving)
        for _ in range(_MAX_RETRIES):
            proposals = {}
            for tp in pending:
                current = ctx.leadership.get(tp)
                gone = [b for b in leaving[tp] if current is not None and b in current.isr]
                if not gone or current.controller_epoch > ctx.epoch.epoch:
                    continue
                isr = current.isr
                for broker_id in gone:  # one by one, as Kafka: the last member stays
                    if len(isr) > 1:
                        isr = tuple(r for r in isr if r != broker_id)
                leader = NO_LEADER if current.leader in gone else current.leader
                proposals[tp] = LeaderAndIsr(leader, current.leader_epoch + 1, isr, ctx.epoch.epoch, current.version)
            if not proposals:
                break
            pending = []
            for tp, written in self.store.update_partition_states(proposals, ctx.epoch).items():
                if isinstance(written, LeaderAndIsr):
                    ctx.leadership[tp] = done[tp] = written
                elif isinstance(written, StaleVersion):
                    pending.append(tp)
            if not pending:
                break
            for topic in {tp[0] for tp in pending}:
                states = self.store.partition_states(topic)
                for tp in [tp for tp in pending if tp[0] == topic]:
                    if tp[1] in states:
                        ctx.leadership[tp] = states[tp[1]]
                    else:
                        pending.remove(tp)
        return done
