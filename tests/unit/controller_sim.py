"""A cluster of controllers on one in-memory ZooKeeper, driven by hand with explicit time.

Each simulated broker has its own store session, its own `Controller` and a model of what
the controller's requests taught it (roles, metadata, deleted replicas); a broker refuses a
request from an older controller epoch, as the real handlers do (STALE_CONTROLLER_EPOCH).
Watches only queue events; `pump()` runs them one at a time, like the asyncio edge does.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

from ottla.cluster.memory_store import MemoryZooKeeper
from ottla.cluster.store import BrokerRegistration, TopicAssignment
from ottla.controller import Controller, ControllerConfig
from ottla.controller.assignment import assign_replicas

TARGETS = ("brokers", "controller", "topics", "topic_deletions", "isr_changes",
           "partition_reassignment", "preferred_replica_election", "config_changes")


@dataclass
class SimBroker:
    broker_id: int
    rack: str | None
    store: object
    controller: Controller
    up: bool = True
    paused: bool = False  # SIGSTOP: hears nothing, does nothing
    epoch: int = 0
    controller_epoch: int = 0          # highest controller epoch accepted
    roles: dict = field(default_factory=dict)       # tp -> "leader" | "follower"
    leader_epochs: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)    # tp -> PartitionState
    live_brokers: set = field(default_factory=set)
    deleted: set = field(default_factory=set)
    stopped: set = field(default_factory=set)
    refused: list = field(default_factory=list)    # requests refused as stale
    received: list = field(default_factory=list)


class Sim:
    def __init__(self, broker_ids=(1, 2, 3), racks=None, config: ControllerConfig | None = None):
        self.zk = MemoryZooKeeper()
        self.config = config or ControllerConfig()
        self.now = 0
        self.events: deque = deque()
        self.brokers: dict[int, SimBroker] = {}
        self.sent: list = []
        for broker_id in broker_ids:
            self.start(broker_id, (racks or {}).get(broker_id))
        self.pump()

    # -- brokers ---------------------------------------------------------------------------
    def start(self, broker_id: int, rack: str | None = None) -> SimBroker:
        old = self.brokers.get(broker_id)
        store = self.zk.session()
        for target in TARGETS:
            store.watch(target, lambda target=target, b=broker_id, s=store: self._queue(b, s, target))
        broker = SimBroker(broker_id, rack if old is None else old.rack, store,
                           Controller(broker_id, store, self.config))
        if old is not None:  # what survives a restart: the data on disk
            broker.deleted = old.deleted
        self.brokers[broker_id] = broker
        broker.epoch = store.register_broker(BrokerRegistration(broker_id, "127.0.0.1", 9000 + broker_id, broker.rack)).epoch
        self.events.append((broker_id, store, "controller"))
        return broker

    def _queue(self, broker_id, store, target):
        self.events.append((broker_id, store, target))

    def kill(self, broker_id: int) -> None:
        """kill -9: the session ends (ZooKeeper notices), the process knows nothing more."""
        broker = self.brokers[broker_id]
        broker.up = False
        broker.store.close()

    def controller(self) -> SimBroker:
        active = [b for b in self.brokers.values() if b.up and b.controller.active]
        assert len(active) == 1, [b.broker_id for b in active]
        return active[0]

    # -- running events ---------------------------------------------------------------------
    def pump(self, limit: int = 1000) -> None:
        for _ in range(limit):
            if not self.events:
                return
            broker_id, store, target = self.events.popleft()
            broker = self.brokers[broker_id]
            if not broker.up or broker.paused or broker.store is not store:
                continue
            c = broker.controller
            handler = {
                "brokers": c.on_brokers_changed, "controller": c.on_controller_changed,
                "topics": c.on_topics_changed, "topic_deletions": c.on_topic_deletions,
                "isr_changes": c.on_isr_changes, "partition_reassignment": c.on_reassignment_request,
                "preferred_replica_election": c.on_preferred_election,
                "config_changes": c.on_config_changes,
            }[target]
            self.deliver(handler(self.now))
        raise AssertionError("events did not settle")

    def advance(self, ms: int) -> None:
        self.now += ms
        for broker in self.brokers.values():
            if broker.up:
                self.deliver(broker.controller.tick(self.now))
        self.pump()

    def deliver(self, requests) -> None:
        """What the edge does: each request to its broker; StopReplica answers go back."""
        queue = deque(requests)
        while queue:
            request = queue.popleft()
            self.sent.append(request)
            broker = self.brokers[request.destination]
            if not broker.up:
                continue
            payload = request.payload
            if payload.controller_epoch < broker.controller_epoch:
                broker.refused.append(request)
                continue
            if payload.broker_epoch not in (-1, broker.epoch):
                broker.refused.append(request)
                continue
            broker.controller_epoch = payload.controller_epoch
            broker.received.append(request)
            if request.kind == "LeaderAndIsr":
                for s in payload.partitions:
                    tp = (s.topic, s.partition)
                    if s.leader_epoch < broker.leader_epochs.get(tp, -1):
                        continue
                    broker.leader_epochs[tp] = s.leader_epoch
                    broker.roles[tp] = "leader" if s.leader == broker.broker_id else "follower"
                    broker.stopped.discard(tp)
            elif request.kind == "UpdateMetadata":
                broker.live_brokers = {b.broker_id for b in payload.live_brokers}
                for s in payload.partitions:
                    tp = (s.topic, s.partition)
                    if s.leader == -2:
                        broker.metadata.pop(tp, None)
                    else:
                        broker.metadata[tp] = s
            else:
                answers = {}
                for p in payload.partitions:
                    tp = (p.topic, p.partition)
                    broker.roles.pop(tp, None)
                    broker.stopped.add(tp)
                    if p.delete:
                        broker.deleted.add(tp)
                        answers[tp] = 0
                if answers:
                    active = [b for b in self.brokers.values() if b.up and b.controller.active]
                    for c in active:
                        queue.extend(c.controller.on_stop_replica_response(broker.broker_id, answers, self.now))

    # -- admin, as the handlers of any broker do it ---------------------------------------
    def create_topic(self, name: str, partitions: int = 3, replication_factor: int = 3,
                     assignment: dict | None = None, configs: dict | None = None, via: int | None = None,
                     start_index: int = 0) -> TopicAssignment:
        store = self.brokers[via or next(b for b in self.brokers if self.brokers[b].up)].store
        if assignment is None:
            assignment = assign_replicas(list(store.live_brokers().values()), partitions,
                                         replication_factor, start_index=start_index)
        topic = TopicAssignment(name, uuid.uuid4(), assignment)
        store.create_topic(topic, configs or {})
        self.pump()
        return topic

    def state(self, topic: str, partition: int = 0):
        return self.zk.states[(topic, partition)]

    def leader_writes_isr(self, topic: str, partition: int, isr) -> None:
        """What a leader does when a follower catches up or falls behind (issue 13)."""
        state = self.state(topic, partition)
        store = self.brokers[state.leader].store
        from ottla.cluster.store import LeaderAndIsr
        store.update_partition_state((topic, partition), LeaderAndIsr(
            state.leader, state.leader_epoch, tuple(isr), state.controller_epoch, state.version), None)
        store.notify_isr_change({(topic, partition)})
        self.pump()
