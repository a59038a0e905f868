"""`ClusterStore` in memory, with ZooKeeper's semantics, so the controller is testable without it.

`MemoryZooKeeper` is the shared ensemble; each `MemoryStore` (from `zk.session()`) is one
broker's session. What the controller relies on behaves as on ZooKeeper: writes fenced by
the `/controller_epoch` version, partition-state updates conditional on their version,
ephemeral nodes (`/brokers/ids/<id>`, `/controller`) owned by a session and gone when it
expires or closes, watches firing after each change (on the writer's thread, after the
change is visible, outside the store's lock: call `store.watch` callbacks that only queue).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Mapping

from .store import (
    BrokerIdInUse,
    BrokerRegistration,
    ControllerEpoch,
    ControllerMoved,
    LeaderAndIsr,
    NoSuchTopic,
    StaleVersion,
    StoreError,
    StoreUnavailable,
    TopicAssignment,
    TopicExists,
    TopicPartition,
    WatchTarget,
)

__all__ = ["MemoryZooKeeper", "MemoryStore"]


class MemoryZooKeeper:
    """The shared znodes of one in-memory "ensemble"; hand out sessions with `session()`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.zxid = 0
        self.cluster_id: str | None = None
        self.brokers: dict[int, tuple[BrokerRegistration, int]] = {}  # id -> (registration, session)
        self.controller: tuple[int, int] | None = None  # (broker id, session)
        self.controller_epoch: ControllerEpoch | None = None
        self.topics: dict[str, TopicAssignment] = {}
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.broker_configs: dict[int | None, dict[str, str]] = {}
        self.group_configs: dict[str, dict[str, str]] = {}
        # (sequence, entity path, created at in wall-clock ms), oldest first
        self.config_changes: list[tuple[int, str, int]] = []
        self.next_config_change = 0  # as ZooKeeper's sequence: never reused after a purge
        self.states: dict[TopicPartition, LeaderAndIsr] = {}
        self.deletions: set[str] = set()
        self.isr_changes: list[set[TopicPartition]] = []
        self.reassignment: dict[TopicPartition, tuple[int, ...]] = {}
        self.preferred: set[TopicPartition] = set()
        self.producer_id_block: tuple[int, int] | None = None
        self.watches: list[tuple["MemoryStore", WatchTarget, Callable[[], None]]] = []
        self.next_session = 1
        self.unavailable = False

    def session(self) -> "MemoryStore":
        with self.lock:
            session = self.next_session
            self.next_session += 1
        return MemoryStore(self, session)

    def write(self) -> int:
        """One more transaction id (a znode's czxid is the broker epoch)."""
        self.zxid += 1
        return self.zxid

    def fire(self, *targets: WatchTarget) -> None:
        """Call every live session's watch on these targets; the caller holds no lock."""
        with self.lock:
            callbacks = [cb for store, target, cb in self.watches
                         if target in targets and not store.closed]
        for callback in callbacks:
            callback()

    def drop_ephemerals(self, session: int) -> list[WatchTarget]:
        """Delete the nodes a session owned; returns the watch targets that changed."""
        changed: list[WatchTarget] = []
        gone = [bid for bid, (_, owner) in self.brokers.items() if owner == session]
        for broker_id in gone:
            del self.brokers[broker_id]
        if gone:
            self.write()
            changed.append("brokers")
        if self.controller is not None and self.controller[1] == session:
            self.controller = None
            self.write()
            changed.append("controller")
        return changed


class MemoryStore:
    """One broker's session on a `MemoryZooKeeper`; implements `ClusterStore`."""

    def __init__(self, zk: MemoryZooKeeper, session: int):
        self.zk = zk
        self.session_id = session
        self.closed = False
        self.session_lost: list[Callable[[], None]] = []

    # -- simulated faults ------------------------------------------------------------------
    def expire_session(self) -> None:
        """What ZooKeeper does when this session times out: ephemerals vanish, watches fire,
        `on_session_lost` callbacks run; the store goes on with a fresh session."""
        with self.zk.lock:
            changed = self.zk.drop_ephemerals(self.session_id)
            self.session_id = self.zk.next_session
            self.zk.next_session += 1
        for callback in list(self.session_lost):
            callback()
        self.zk.fire(*changed)

    def _check(self) -> None:
        if self.closed:
            raise StoreUnavailable("the store is closed")
        if self.zk.unavailable:
            raise StoreUnavailable("ZooKeeper does not answer")

    def _fence(self, epoch: ControllerEpoch | None) -> None:
        if epoch is None:
            return
        current = self.zk.controller_epoch
        if current is None or current.version != epoch.version:
            raise ControllerMoved(f"controller epoch version {epoch.version} is not current "
                                  f"({current.version if current else None})")

    # -- cluster ---------------------------------------------------------------------------
    def cluster_id(self, proposed: str) -> str:
        with self.zk.lock:
            self._check()
            if self.zk.cluster_id is None:
                self.zk.cluster_id = proposed
                self.zk.write()
            return self.zk.cluster_id

    # -- membership ------------------------------------------------------------------------
    def register_broker(self, registration: BrokerRegistration) -> BrokerRegistration:
        with self.zk.lock:
            self._check()
            if registration.broker_id in self.zk.brokers:
                raise BrokerIdInUse(f"broker id {registration.broker_id} is already registered")
            registered = dataclasses.replace(registration, epoch=self.zk.write())
            self.zk.brokers[registration.broker_id] = (registered, self.session_id)
        self.zk.fire("brokers")
        return registered

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        with self.zk.lock:
            self._check()
            return {bid: reg for bid, (reg, _) in sorted(self.zk.brokers.items())}

    # -- controller ------------------------------------------------------------------------
    def elect_controller(self, broker_id: int) -> ControllerEpoch | None:
        with self.zk.lock:
            self._check()
            if self.zk.controller is not None:
                return None
            self.zk.controller = (broker_id, self.session_id)
            # Kafka creates /controller_epoch with epoch 0 (version 0), then bumps it.
            old = self.zk.controller_epoch or ControllerEpoch(0, 0)
            self.zk.controller_epoch = ControllerEpoch(old.epoch + 1, old.version + 1)
            self.zk.write()
            epoch = self.zk.controller_epoch
        self.zk.fire("controller")
        return epoch

    def controller_id(self) -> int | None:
        with self.zk.lock:
            self._check()
            return None if self.zk.controller is None else self.zk.controller[0]

    def controller_epoch(self) -> ControllerEpoch | None:
        with self.zk.lock:
            self._check()
            return self.zk.controller_epoch

    def resign_controller(self, broker_id: int) -> None:
        with self.zk.lock:
            self._check()
            if self.zk.controller is None or self.zk.controller[0] != broker_id:
                return
            self.zk.controller = None
            self.zk.write()
        self.zk.fire("controller")

    # -- topics ----------------------------------------------------------------------------
    def topics(self) -> dict[str, TopicAssignment]:
        with self.zk.lock:
            self._check()
            return dict(self.zk.topics)

    def create_topic(self, assignment: TopicAssignment, configs: Mapping[str, str]) -> None:
        with self.zk.lock:
            self._check()
            if assignment.name in self.zk.topics or assignment.name in self.zk.deletions:
                raise TopicExists(f"Topic '{assignment.name}' already exists.")
            self.zk.topic_configs[assignment.name] = dict(configs)
            self.zk.topics[assignment.name] = _frozen(assignment)
            self.zk.write()
        self.zk.fire("topics")

    def set_assignment(self, assignment: TopicAssignment, epoch: ControllerEpoch | None) -> None:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            if assignment.name not in self.zk.topics:
                raise NoSuchTopic(assignment.name)
            self.zk.topics[assignment.name] = _frozen(assignment)
            self.zk.write()
        self.zk.fire("topics")

    def topic_configs(self, name: str) -> dict[str, str]:
        with self.zk.lock:
            self._check()
            return dict(self.zk.topic_configs.get(name, {}))

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        with self.zk.lock:
            self._check()
            if name not in self.zk.topics:
                raise NoSuchTopic(name)
            self.zk.topic_configs[name] = dict(configs)
            self._announce(f"topics/{name}")
            self.zk.write()
        self.zk.fire("config_changes")

    def config_changes(self, after: int) -> list[tuple[int, str]]:
        with self.zk.lock:
            self._check()
            return [(seq, path) for seq, path, _ in self.zk.config_changes if seq > after]

    def purge_config_changes(self, before_ms: int) -> None:
        with self.zk.lock:
            self._check()
            self.zk.config_changes = [c for c in self.zk.config_changes if c[2] >= before_ms]

    def _announce(self, entity_path: str) -> None:
        """A `/config/changes` notification; the caller holds the lock."""
        self.zk.config_changes.append((self.zk.next_config_change, entity_path, int(time.time() * 1000)))
        self.zk.next_config_change += 1

    def broker_configs(self, broker_id: int | None) -> dict[str, str]:
        with self.zk.lock:
            self._check()
            return dict(self.zk.broker_configs.get(broker_id, {}))

    def set_broker_configs(self, broker_id: int | None, configs: Mapping[str, str]) -> None:
        with self.zk.lock:
            self._check()
            self.zk.broker_configs[broker_id] = dict(configs)
            self._announce(f"brokers/{'<default>' if broker_id is None else broker_id}")
            self.zk.write()
        self.zk.fire("config_changes")

    def group_configs(self, name: str) -> dict[str, str]:
        with self.zk.lock:
            self._check()
            return dict(self.zk.group_configs.get(name, {}))

    def group_config_names(self) -> list[str]:
        with self.zk.lock:
            self._check()
            return sorted(self.zk.group_configs)

    def set_group_configs(self, name: str, configs: Mapping[str, str]) -> None:
        with self.zk.lock:
            self._check()
            if configs:
                self.zk.group_configs[name] = dict(configs)
                self._announce(f"groups/{name}")
            else:
                self.zk.group_configs.pop(name, None)
            self.zk.write()
        self.zk.fire("config_changes")

    # -- partition state -------------------------------------------------------------------
    def partition_states(self, topic: str) -> dict[int, LeaderAndIsr]:
        with self.zk.lock:
            self._check()
            return {p: s for (t, p), s in sorted(self.zk.states.items()) if t == topic}

    def create_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch) -> dict[TopicPartition, LeaderAndIsr]:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            for tp in states:
                if tp[0] not in self.zk.topics:
                    raise NoSuchTopic(tp[0])
                if tp in self.zk.states:
                    raise StaleVersion(f"state of {tp[0]}-{tp[1]} already exists")
            created = {tp: dataclasses.replace(s, isr=tuple(s.isr), version=0)
                       for tp, s in states.items()}
            self.zk.states.update(created)
            self.zk.write()
            return created

    def update_partition_state(self, partition: TopicPartition, state: LeaderAndIsr,
                               epoch: ControllerEpoch | None) -> LeaderAndIsr:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            return self._update_state(partition, state)

    def _update_state(self, partition: TopicPartition, state: LeaderAndIsr) -> LeaderAndIsr:
        current = self.zk.states.get(partition)
        if current is None:
            raise NoSuchTopic(f"{partition[0]}-{partition[1]}")
        if current.version != state.version:
            raise StaleVersion(f"state of {partition[0]}-{partition[1]} is at version "
                               f"{current.version}, not {state.version}")
        updated = dataclasses.replace(state, isr=tuple(state.isr), version=current.version + 1)
        self.zk.states[partition] = updated
        self.zk.write()
        return updated

    def update_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch) -> dict[TopicPartition, LeaderAndIsr | StoreError]:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            out: dict[TopicPartition, LeaderAndIsr | StoreError] = {}
            for tp, state in states.items():
                try:
                    out[tp] = self._update_state(tp, state)
                except (StaleVersion, NoSuchTopic) as refused:
                    out[tp] = refused
            return out

    # -- topic deletion --------------------------------------------------------------------
    def request_topic_deletion(self, name: str) -> None:
        with self.zk.lock:
            self._check()
            if name not in self.zk.topics:
                raise NoSuchTopic(name)
            if name in self.zk.deletions:
                return
            self.zk.deletions.add(name)
            self.zk.write()
        self.zk.fire("topic_deletions")

    def topics_to_delete(self) -> set[str]:
        with self.zk.lock:
            self._check()
            return set(self.zk.deletions)

    def complete_topic_deletion(self, name: str, epoch: ControllerEpoch) -> None:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            self.zk.topics.pop(name, None)
            self.zk.topic_configs.pop(name, None)
            for tp in [tp for tp in self.zk.states if tp[0] == name]:
                del self.zk.states[tp]
            self.zk.deletions.discard(name)
            self.zk.write()
        self.zk.fire("topics", "topic_deletions")

    # -- notifications and admin requests --------------------------------------------------
    def notify_isr_change(self, partitions: set[TopicPartition]) -> None:
        with self.zk.lock:
            self._check()
            self.zk.isr_changes.append(set(partitions))
            self.zk.write()
        self.zk.fire("isr_changes")

    def take_isr_changes(self) -> set[TopicPartition]:
        with self.zk.lock:
            self._check()
            taken = set().union(*self.zk.isr_changes) if self.zk.isr_changes else set()
            had = bool(self.zk.isr_changes)
            self.zk.isr_changes.clear()
        if had:
            self.zk.fire("isr_changes")
        return taken

    def reassignment_request(self) -> dict[TopicPartition, tuple[int, ...]]:
        with self.zk.lock:
            self._check()
            return dict(self.zk.reassignment)

    def request_reassignment(self, targets: Mapping[TopicPartition, tuple[int, ...]]) -> None:
        with self.zk.lock:
            self._check()
            self.zk.reassignment.update({tp: tuple(r) for tp, r in targets.items()})
            self.zk.write()
        self.zk.fire("partition_reassignment")

    def clear_reassignment(self, done: set[TopicPartition], epoch: ControllerEpoch) -> None:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            for tp in done:
                self.zk.reassignment.pop(tp, None)
            self.zk.write()
        self.zk.fire("partition_reassignment")

    def preferred_election_request(self) -> set[TopicPartition]:
        with self.zk.lock:
            self._check()
            return set(self.zk.preferred)

    def request_preferred_election(self, partitions: set[TopicPartition]) -> None:
        with self.zk.lock:
            self._check()
            self.zk.preferred |= set(partitions)
            self.zk.write()
        self.zk.fire("preferred_replica_election")

    def clear_preferred_election(self, epoch: ControllerEpoch) -> None:
        with self.zk.lock:
            self._check()
            self._fence(epoch)
            self.zk.preferred.clear()
            self.zk.write()
        self.zk.fire("preferred_replica_election")

    # -- producer ids ----------------------------------------------------------------------
    def claim_producer_id_block(self, broker_id: int, block_size: int) -> tuple[int, int]:
        with self.zk.lock:
            self._check()
            first = 0 if self.zk.producer_id_block is None else self.zk.producer_id_block[1] + 1
            self.zk.producer_id_block = (first, first + block_size - 1)
            self.zk.write()
            return self.zk.producer_id_block

    # -- watches and lifecycle -------------------------------------------------------------
    def watch(self, target: WatchTarget, callback: Callable[[], None]) -> None:
        with self.zk.lock:
            self.zk.watches.append((self, target, callback))

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        self.session_lost.append(callback)

    @property
    def connected(self) -> bool:
        return not self.closed and not self.zk.unavailable

    def close(self) -> None:
        """A clean close ends the session: its ephemeral nodes go at once."""
        with self.zk.lock:
            if self.closed:
                return
            self.closed = True
            changed = self.zk.drop_ephemerals(self.session_id)
        self.zk.fire(*changed)


def _frozen(assignment: TopicAssignment) -> TopicAssignment:
    """A copy whose mappings the caller cannot change under the store."""
    return dataclasses.replace(
        assignment,
        partitions={p: tuple(r) for p, r in sorted(assignment.partitions.items())},
        adding_replicas={p: tuple(r) for p, r in assignment.adding_replicas.items()},
        removing_replicas={p: tuple(r) for p, r in assignment.removing_replicas.items()},
    )
