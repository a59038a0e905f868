"""The controller (Kafka's `KafkaController` over ZooKeeper), as a state machine.

One broker at a time wins `/controller` and is the controller for its epoch. It is driven
by events, each a method call with an explicit `now_ms`, run one at a time off the event
loop (they call the blocking store): a watch fired, a ControlledShutdown, ElectLeaders or
AlterPartitionReassignments request arrived, a StopReplica answer came back, time passed.
Each returns the requests the event produced (`ControllerRequest`), for the edge to send.
A write the store refuses as fenced (another controller was elected) makes this one step
down at once, writing nothing more.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Iterable, Literal, Mapping

from ..cluster.store import ClusterStore, ControllerMoved, TopicPartition
from ..errors import ErrorCode
from . import elections
from .context import ControllerConfig, ControllerContext, PartitionPhase, ReplicaPhase
from .deletion import TopicDeletionManager
from .partitions import ElectionFailed, PartitionStateMachine
from .reassignment import ReassignmentManager
from .replicas import ReplicaStateMachine
from .requests import ControllerRequest

log = logging.getLogger("ottla.controller")

__all__ = ["Controller", "ControllerConfig"]

# Kafka schedules the first automatic preferred-leader check 5 s after failover.
_FIRST_REBALANCE_DELAY_MS = 5_000

Results = dict[TopicPartition, tuple[ErrorCode, str | None]]


class Controller:
    def __init__(self, broker_id: int, store: ClusterStore, config: ControllerConfig | None = None):
        self.broker_id = broker_id
        self.store = store
        self.config = config or ControllerConfig()
        self.ctx: ControllerContext | None = None
        self.next_rebalance_ms: int | None = None
        # Where each batch of requests goes as soon as it closes (the edge sends it); without
        # one, each event returns its requests.
        self.sink: Callable[[list[ControllerRequest]], None] | None = None

    @property
    def active(self) -> bool:
        return self.ctx is not None

    @property
    def epoch(self):
        return None if self.ctx is None else self.ctx.epoch

    # -- running one event -----------------------------------------------------------------
    def _run(self, action: Callable[[], object]) -> tuple[object, list[ControllerRequest]]:
        if self.ctx is None:
            return None, []
        try:
            result = action()
        except ControllerMoved:
            log.warning("controller: broker %d is no longer the controller (epoch %d fenced)",
                        self.broker_id, self.ctx.epoch.epoch)
            self.ctx = None
            return None, []
        return result, self._flush()

    def _flush(self) -> list[ControllerRequest]:
        return self.ctx.take_requests()

    # -- election and failover -------------------------------------------------------------
    def elect(self, now_ms: int) -> list[ControllerRequest]:
        """Try to become controller (at startup, and whenever `/controller` goes away)."""
        if self.ctx is not None:
            return []
        epoch = self.store.elect_controller(self.broker_id)
        if epoch is None:
            return []
        log.info("controller: broker %d is controller, epoch %d", self.broker_id, epoch.epoch)
        self.ctx = ControllerContext(self.broker_id, epoch, self.sink)
        _, requests = self._run(lambda: self._failover(now_ms))
        return requests

    def resync(self, now_ms: int) -> list[ControllerRequest]:
        """Rebuild the context from the store, as a newly elected controller does (same
        epoch): after an event the store cut off part-way, the context cannot be trusted."""
        if self.ctx is None:
            return []
        self.ctx = ControllerContext(self.broker_id, self.ctx.epoch, self.sink)
        _, requests = self._run(lambda: self._failover(now_ms))
        return requests

    def _failover(self, now_ms: int) -> None:
        ctx = self.ctx
        store = self.store
        ctx.brokers = store.live_brokers()
        ctx.topics = store.topics()
        for name in ctx.topics:
            for p, state in store.partition_states(name).items():
                ctx.leadership[(name, p)] = state
        queued = store.topics_to_delete()
        ctx.deleting = queued & set(ctx.topics)
        self._machines()
        # Every broker hears the whole cluster, then its roles (Kafka sends the live
        # brokers first; here every partition too, so offline ones are not left out). A
        # batch of its own: a batch sends LeaderAndIsr first, and a broker that leads a
        # `__transaction_state` partition then rolled prepared transactions forward before
        # its metadata knew their topics, skipping their markers as for deleted topics.
        ctx.send_update_metadata(ctx.brokers, list(ctx.partitions()))
        ctx.flush()
        self.replicas.startup()
        self.partitions.startup()
        self.reassignments.resume()
        self._take_reassignment_requests()
        self._take_preferred_requests()
        self.deletion.enqueue(queued)
        self._take_isr_changes()
        self.next_rebalance_ms = now_ms + _FIRST_REBALANCE_DELAY_MS

    def _machines(self) -> None:
        ctx = self.ctx
        self.partitions = PartitionStateMachine(ctx, self.store, lambda: self.config.unclean_leader_election_enable)
        self.replicas = ReplicaStateMachine(ctx, self.store)
        self.deletion = TopicDeletionManager(ctx, self.store, self.partitions, self.replicas)
        self.reassignments = ReassignmentManager(ctx, self.store, self.partitions, self.replicas)

    def on_controller_changed(self, now_ms: int) -> list[ControllerRequest]:
        """`/controller` changed: step down if it is no longer ours; run if it is free."""
        current = self.store.controller_id()
        if self.ctx is not None and current != self.broker_id:
            log.warning("controller: broker %d resigns, /controller is now %s", self.broker_id, current)
            self.ctx = None
        if current is None:
            return self.elect(now_ms)
        return []

    def on_session_lost(self) -> None:
        """The store's session expired: `/controller` is gone with it; forget everything."""
        self.ctx = None

    def resign(self) -> None:
        """Give up the role on purpose (this broker is shutting down)."""
        if self.ctx is not None:
            self.ctx = None
            self.store.resign_controller(self.broker_id)

    # -- brokers ---------------------------------------------------------------------------
    def on_brokers_changed(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(self._brokers_changed)[1]

    def _brokers_changed(self) -> None:
        ctx = self.ctx
        current = self.store.live_brokers()
        old = ctx.brokers
        new = set(current) - set(old)
        dead = set(old) - set(current)
        bounced = {b for b in set(current) & set(old) if current[b].epoch > old[b].epoch}
        ctx.brokers = {b: r for b, r in current.items() if b not in bounced}
        if new:
            self._broker_startup(new)
        if bounced:
            self._broker_failure(bounced)
            ctx.flush()
            ctx.brokers.update({b: current[b] for b in bounced})
            self._broker_startup(bounced)
        if dead:
            self._broker_failure(dead)

    def _broker_startup(self, broker_ids: set[int]) -> None:
        ctx = self.ctx
        log.info("controller: brokers %s started", sorted(broker_ids))
        ctx.send_update_metadata(set(ctx.brokers) - broker_ids)
        ctx.send_update_metadata(broker_ids, list(ctx.partitions()))
        ctx.flush()  # before the new brokers' LeaderAndIsr, as in _failover
        replicas = [r for r in ctx.replicas_on(broker_ids) if r[0][0] not in ctx.deleting]
        self.replicas.handle(replicas, ReplicaPhase.ONLINE)
        self.partitions.trigger_online()
        self.reassignments.resume(broker_ids)
        if any(r[0][0] in ctx.deleting for r in ctx.replicas_on(broker_ids)):
            self.deletion.resume()

    def _broker_failure(self, broker_ids: set[int]) -> None:
        ctx = self.ctx
        log.info("controller: brokers %s failed", sorted(broker_ids))
        ctx.shutting_down -= broker_ids
        offline = ctx.replicas_on(broker_ids)
        led = [tp for tp in ctx.partitions()
               if ctx.leader(tp) in broker_ids and tp[0] not in ctx.deleting]
        self.partitions.handle(led, PartitionPhase.OFFLINE)
        self.partitions.trigger_online()
        self.replicas.handle([r for r in offline if r[0][0] not in ctx.deleting], ReplicaPhase.OFFLINE)
        self.deletion.on_brokers_failed(broker_ids)
        ctx.send_update_metadata(ctx.brokers, [tp for tp in {r[0] for r in offline}])

    # -- topics ----------------------------------------------------------------------------
    def on_topics_changed(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(self._topics_changed)[1]

    def _topics_changed(self) -> None:
        ctx = self.ctx
        stored = self.store.topics()
        for name in set(ctx.topics) - set(stored):
            self._forget(name)
        added: list[TopicPartition] = []
        for name, assignment in stored.items():
            known = ctx.topics.get(name)
            if known is not None and known.topic_id != assignment.topic_id:
                self._forget(name)  # deleted and created again between two watches
                known = None
            new = sorted(set(assignment.partitions) - set(known.partitions if known else ()))
            if known is None or new:
                ctx.topics[name] = assignment
                added += [(name, p) for p in new]
        if added:
            self._new_partitions(added)

    def _forget(self, name: str) -> None:
        ctx = self.ctx
        for tp in list(ctx.partitions([name])):
            ctx.leadership.pop(tp, None)
            ctx.partition_phase.pop(tp, None)
        for replica in [r for r in ctx.replica_phase if r[0][0] == name]:
            del ctx.replica_phase[replica]
        ctx.topics.pop(name, None)
        ctx.deleting.discard(name)

    def _new_partitions(self, tps: list[TopicPartition]) -> None:
        ctx = self.ctx
        replicas = [(tp, b) for tp in tps for b in ctx.replicas(tp)]
        self.partitions.handle(tps, PartitionPhase.NEW)
        self.replicas.handle(replicas, ReplicaPhase.NEW)
        self.partitions.handle(tps, PartitionPhase.ONLINE)
        self.replicas.handle(replicas, ReplicaPhase.ONLINE)

    def on_topic_deletions(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(lambda: self.deletion.enqueue(self.store.topics_to_delete()))[1]

    def on_stop_replica_response(self, broker_id: int, errors: Mapping[TopicPartition, int],
                                 now_ms: int) -> list[ControllerRequest]:
        return self._run(lambda: self.deletion.on_stop_replica_response(broker_id, dict(errors)))[1]

    # -- ISR changes -----------------------------------------------------------------------
    def on_isr_changes(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(self._take_isr_changes)[1]

    def _take_isr_changes(self) -> None:
        ctx = self.ctx
        changed = [tp for tp in sorted(self.store.take_isr_changes()) if tp[0] in ctx.topics]
        self.partitions.refresh(changed)
        ctx.send_update_metadata(ctx.brokers, changed)
        for tp in changed:
            self.reassignments.maybe_complete(tp)

    # -- preferred leaders -----------------------------------------------------------------
    def elect_leaders(self, partitions: Iterable[TopicPartition],
                      election: Literal["preferred", "unclean"], now_ms: int) -> tuple[Results, list[ControllerRequest]]:
        """ElectLeaders: per partition, NONE or why not (Kafka's codes)."""
        if self.ctx is None:
            return {tp: (ErrorCode.not_controller, None) for tp in partitions}, []
        results, requests = self._run(lambda: self._elect_leaders(list(partitions), election))
        if results is None:
            return {tp: (ErrorCode.not_controller, None) for tp in partitions}, []
        return results, requests

    def _elect_leaders(self, tps: list[TopicPartition], election: str) -> Results:
        ctx = self.ctx
        results: Results = {}
        todo = []
        for tp in tps:
            replicas = ctx.replicas(tp)
            if not replicas or tp[0] in ctx.deleting:
                results[tp] = (ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
            elif election == "preferred" and ctx.leader(tp) == replicas[0]:
                results[tp] = (ErrorCode.election_not_needed, "Leader is already the preferred replica.")
            elif election == "unclean" and ctx.is_online(ctx.leader(tp), True):
                results[tp] = (ErrorCode.election_not_needed, "The partition has a leader.")
            else:
                todo.append(tp)
        strategy = elections.PREFERRED if election == "preferred" else elections.Strategy("offline", True)
        for tp, outcome in self.partitions.handle(todo, PartitionPhase.ONLINE, strategy).items():
            if isinstance(outcome, ElectionFailed):
                code = (ErrorCode.preferred_leader_not_available if election == "preferred"
                        else ErrorCode.eligible_leaders_not_available)
                results[tp] = (code, str(outcome))
            else:
                results[tp] = (ErrorCode.none, None)
        return results

    def on_config_changes(self, now_ms: int) -> list[ControllerRequest]:
        """A config changed (`/config/changes`): an Offline partition whose topic now allows
        unclean election gets a leader."""
        return self._run(lambda: self.partitions.trigger_unclean())[1]

    def set_unclean_default(self, enabled: bool) -> bool:
        """The broker's dynamic unclean.leader.election.enable (Kafka's is cluster-wide): the
        default of every topic without a value of its own, from the next election. True when it
        was just turned on: then the Offline partitions it allows are to be elected at once
        (`on_config_changes`), as Kafka's controller does on its UncleanLeaderElectionEnable."""
        turned_on = enabled and not self.config.unclean_leader_election_enable
        self.config = replace(self.config, unclean_leader_election_enable=enabled)
        return turned_on

    def on_preferred_election(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(self._take_preferred_requests)[1]

    def _take_preferred_requests(self) -> None:
        requested = self.store.preferred_election_request()
        if requested:
            self._elect_leaders(sorted(requested), "preferred")
            self.store.clear_preferred_election(self.ctx.epoch)

    def tick(self, now_ms: int) -> list[ControllerRequest]:
        """Time passed: the automatic preferred-leader check (`auto.leader.rebalance.enable`)."""
        if self.ctx is None or self.next_rebalance_ms is None or now_ms < self.next_rebalance_ms:
            return []
        self.next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        if not self.config.auto_leader_rebalance_enable:
            return []
        return self._run(self._rebalance)[1]

    def _rebalance(self) -> None:
        """Per preferred broker: when more than `leader.imbalance.per.broker.percentage` of the
        partitions it should lead are led elsewhere, move back those it can lead."""
        ctx = self.ctx
        by_preferred: dict[int, list[TopicPartition]] = {}
        for tp in ctx.partitions():
            if tp[0] not in ctx.deleting and ctx.replicas(tp):
                by_preferred.setdefault(ctx.replicas(tp)[0], []).append(tp)
        for preferred, tps in sorted(by_preferred.items()):
            elsewhere = [tp for tp in tps if tp in ctx.leadership and ctx.leader(tp) != preferred]
            if len(elsewhere) / len(tps) <= self.config.leader_imbalance_per_broker_percentage / 100:
                continue
            eligible = [tp for tp in elsewhere
                        if ctx.is_online(preferred) and preferred in ctx.leadership[tp].isr]
            if eligible:
                log.info("controller: moving %d partitions back to preferred leader %d", len(eligible), preferred)
                self._elect_leaders(eligible, "preferred")

    # -- reassignment ----------------------------------------------------------------------
    def alter_reassignments(self, targets: Mapping[TopicPartition, tuple[int, ...] | None],
                            now_ms: int, allow_rf_change: bool = True) -> tuple[Results, list[ControllerRequest]]:
        """AlterPartitionReassignments: a target per partition, None to cancel; with
        `allow_rf_change` false (v1, KIP-860) a target of another size is refused."""
        if self.ctx is None:
            return {tp: (ErrorCode.not_controller, None) for tp in targets}, []
        results, requests = self._run(lambda: self.reassignments.alter(targets, allow_rf_change=allow_rf_change))
        if results is None:
            return {tp: (ErrorCode.not_controller, None) for tp in targets}, []
        return results, requests

    def list_reassignments(self, partitions: Iterable[TopicPartition] | None = None):
        """ListPartitionReassignments: partition -> (replicas, adding, removing); None if
        this broker is not the controller."""
        if self.ctx is None:
            return None
        ongoing = self.reassignments.in_progress()
        if partitions is None:
            return ongoing
        return {tp: ongoing[tp] for tp in partitions if tp in ongoing}

    def on_reassignment_request(self, now_ms: int) -> list[ControllerRequest]:
        return self._run(self._take_reassignment_requests)[1]

    def _take_reassignment_requests(self) -> None:
        requested = self.store.reassignment_request()
        fresh = {tp: target for tp, target in requested.items()
                 if not (tp in self.reassignments.from_store
                         and tuple(r for r in self.ctx.replicas(tp) if r not in self.ctx.removing(tp)) == target)}
        results = self.reassignments.alter(fresh, from_store=True)
        failed = {tp for tp, (error, _) in results.items() if error != ErrorCode.none}
        if failed:
            self.store.clear_reassignment(failed, self.ctx.epoch)

    # -- controlled shutdown ---------------------------------------------------------------
    def controlled_shutdown(self, broker_id: int, broker_epoch: int,
                            now_ms: int) -> tuple[ErrorCode, set[TopicPartition], list[ControllerRequest]]:
        """ControlledShutdown: move leadership off `broker_id`, take it out of the ISRs it
        follows; returns the replicated partitions it still leads (it retries until none). A
        partition with one replica has nowhere to go and is not counted, as in Kafka
        (`replicatedPartitionsBrokerLeads`): it would only make the broker retry in vain."""
        if self.ctx is None:
            return ErrorCode.not_controller, set(), []
        ctx = self.ctx
        known = ctx.brokers.get(broker_id)
        if known is None:
            return ErrorCode.broker_not_available, set(), []
        if broker_epoch != -1 and broker_epoch < known.epoch:
            return ErrorCode.stale_broker_epoch, set(), []
        remaining, requests = self._run(lambda: self._controlled_shutdown(broker_id))
        if remaining is None:
            return ErrorCode.not_controller, set(), []
        return ErrorCode.none, remaining, requests

    def _controlled_shutdown(self, broker_id: int) -> set[TopicPartition]:
        ctx = self.ctx
        ctx.shutting_down.add(broker_id)
        log.info("controller: controlled shutdown of broker %d", broker_id)
        act_on = [tp for tp in ctx.partitions()
                  if broker_id in ctx.replicas(tp) and len(ctx.replicas(tp)) > 1
                  and tp in ctx.leadership and tp[0] not in ctx.deleting]
        led = [tp for tp in act_on if ctx.leader(tp) == broker_id]
        followed = [tp for tp in act_on if ctx.leader(tp) != broker_id]
        self.partitions.handle(led, PartitionPhase.ONLINE, elections.CONTROLLED_SHUTDOWN)
        self.replicas.handle([(tp, broker_id) for tp in followed], ReplicaPhase.OFFLINE)
        return {tp for tp in ctx.partitions()
                if ctx.leader(tp) == broker_id and len(ctx.replicas(tp)) > 1 and tp[0] not in ctx.deleting}
