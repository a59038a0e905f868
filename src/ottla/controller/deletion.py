"""Topic deletion (Kafka's `TopicDeletionManager`).

A topic queued in `/admin/delete_topics` is deleted in two steps: every broker is told to
forget its partitions (UpdateMetadata with leader -2), then every replica is asked to
delete its data (StopReplica with delete). A replica on a broker that is down is
ReplicaDeletionIneligible: the deletion waits, and resumes when that broker comes back.
Only when every replica answered success are the topic's znodes removed.
"""

from __future__ import annotations

import logging

from .context import ControllerContext, PartitionPhase, ReplicaPhase
from .partitions import PartitionStateMachine
from .replicas import ReplicaStateMachine

log = logging.getLogger("ottla.controller")
P = ReplicaPhase


class TopicDeletionManager:
    def __init__(self, ctx: ControllerContext, store, partitions: PartitionStateMachine,
                 replicas: ReplicaStateMachine):
        self.ctx = ctx
        self.store = store
        self.partitions = partitions
        self.replicas = replicas
        self.started: set[str] = set()  # topics whose UpdateMetadata (-2) went out

    def enqueue(self, topics: set[str]) -> None:
        ctx = self.ctx
        new = {t for t in topics if t in ctx.topics} - ctx.deleting
        ctx.deleting |= new
        # Topics queued without a topic znode (half-done deletion): just finish.
        for name in topics - set(ctx.topics):
            self.store.complete_topic_deletion(name, ctx.epoch)
        self.resume()

    def on_stop_replica_response(self, broker_id: int, errors: dict) -> None:
        """Per partition: 0 = deleted, anything else = ineligible for now."""
        for tp, error in errors.items():
            replica = (tp, broker_id)
            if tp[0] not in self.ctx.deleting or self.replicas.phase(replica) is not P.DELETION_STARTED:
                continue
            if error == 0:
                self.replicas.handle([replica], P.DELETION_SUCCESSFUL)
            else:
                log.info("controller: broker %d failed to delete %s-%d (error %s); will retry",
                         broker_id, tp[0], tp[1], error)
                self.replicas.handle([replica], P.DELETION_INELIGIBLE)
        self.resume()

    def on_brokers_failed(self, broker_ids: set[int]) -> None:
        """Deletions waiting on these brokers cannot finish until they return."""
        for replica, phase in list(self.ctx.replica_phase.items()):
            if replica[1] in broker_ids and replica[0][0] in self.ctx.deleting and phase in (
                    P.DELETION_STARTED, P.ONLINE, P.OFFLINE, P.NEW):
                if phase in (P.ONLINE, P.NEW):
                    self.ctx.replica_phase[replica] = P.OFFLINE
                self.replicas.handle([replica], P.DELETION_INELIGIBLE)

    def resume(self) -> None:
        ctx = self.ctx
        for topic in sorted(ctx.deleting):
            replicas = [(tp, b) for tp in ctx.partitions([topic]) for b in ctx.replicas(tp)]
            phases = [self.replicas.phase(r) for r in replicas]
            if all(p is P.DELETION_SUCCESSFUL for p in phases):
                self._complete(topic, replicas)
                continue
            if topic not in self.started:
                self.started.add(topic)
                # Brokers stop serving it at once (leader -2), before any data goes.
                ctx.send_update_metadata(ctx.brokers, list(ctx.partitions([topic])))
            retry = []
            for replica, phase in zip(replicas, phases):
                if phase in (P.DELETION_STARTED, P.DELETION_SUCCESSFUL):
                    continue
                if not ctx.is_online(replica[1], include_shutting_down=True):
                    if phase is not P.DELETION_INELIGIBLE:
                        ctx.replica_phase[replica] = P.OFFLINE
                        self.replicas.handle([replica], P.DELETION_INELIGIBLE)
                    continue
                retry.append(replica)
            # Live replicas: OfflineReplica (stop fetching) then ReplicaDeletionStarted.
            for replica in retry:
                ctx.replica_phase[replica] = P.OFFLINE
            self.replicas.handle(retry, P.DELETION_STARTED)

    def _complete(self, topic: str, replicas) -> None:
        ctx = self.ctx
        self.replicas.handle(replicas, P.NON_EXISTENT)
        tps = list(ctx.partitions([topic]))
        for tp in tps:
            ctx.partition_phase[tp] = PartitionPhase.OFFLINE
        self.partitions.handle(tps, PartitionPhase.NON_EXISTENT)
        self.store.complete_topic_deletion(topic, ctx.epoch)
        ctx.topics.pop(topic, None)
        ctx.deleting.discard(topic)
        self.started.discard(topic)
        log.info("controller: deleted topic %s", topic)
