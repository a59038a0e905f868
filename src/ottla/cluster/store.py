"""The cluster's shared metadata, as the controller and brokers see it: one small interface.

Kafka kept this in ZooKeeper; `cluster/zk.py` implements the interface on ZooKeeper with
Kafka's own paths and JSON, so Kafka's knowledge and tools apply to an Ottla cluster.
The controller's state machines are written against this interface only, so tests can
drive them without sockets (`cluster/memory_store.py` keeps the same semantics in memory).

Every method is blocking and may be slow (a ZooKeeper round trip): call it off the event
loop. Watch callbacks fire on the store's own thread; hand them to the loop with
`loop.call_soon_threadsafe`. A watch fires once per change burst and is re-armed by the
store: callers re-read the state they care about, they are never told what changed.

Fencing: every write the controller makes to partition state or assignments carries the
controller epoch's version (`ControllerEpoch.version`, the znode version of
`/controller_epoch`); the store applies the write only if that version is still current
(Kafka wraps each such write in a ZooKeeper multi with a check on `/controller_epoch`),
so a deposed controller can write nothing. Writes to one partition's state are also
conditional on the state's own version (`LeaderAndIsr.version`), so a leader shrinking its
ISR and a controller electing a new leader never overwrite each other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Protocol

TopicPartition = tuple[str, int]

# Kafka's LeaderAndIsr.NoLeader; a partition whose leader is -1 is offline.
NO_LEADER = -1


class StoreError(Exception):
    """Base of the store's refusals."""


class BrokerIdInUse(StoreError):
    """`/brokers/ids/<id>` exists: another live broker has this broker.id."""


class TopicExists(StoreError):
    """`/brokers/topics/<name>` exists (or is being deleted)."""


class NoSuchTopic(StoreError):
    pass


class ControllerMoved(StoreError):
    """The write carried a controller epoch version that is no longer current."""


class StaleVersion(StoreError):
    """A conditional write found the znode at another version than expected."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (session lost, connection refused, chroot missing)."""


@dataclass(frozen=True)
class BrokerRegistration:
    """`/brokers/ids/<id>`: Kafka's JSON (version 5: endpoints, rack)."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    # The znode's creation transaction id: Kafka's "broker epoch", which tells a restarted
    # broker from its previous incarnation. Filled in by the store; 0 before registration.
    epoch: int = 0


@dataclass(frozen=True)
class ControllerEpoch:
    """`/controller_epoch`: the epoch number and its znode version (the fencing token)."""

    epoch: int
    version: int


@dataclass(frozen=True)
class LeaderAndIsr:
    """`/brokers/topics/<t>/partitions/<p>/state`: Kafka's JSON (version 1)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    # The state znode's version; the next conditional update must name it. -1: not stored yet.
    version: int = -1


@dataclass(frozen=True)
class TopicAssignment:
    """`/brokers/topics/<t>`: Kafka's JSON (version 3: partitions, topic_id, adding/removing)."""

    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, tuple[int, ...]]
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


WatchTarget = Literal[
    "brokers",                    # /brokers/ids children
    "controller",                 # /controller created or deleted
    "topics",                     # /brokers/topics children, or any topic's assignment
    "topic_deletions",            # /admin/delete_topics children
    "isr_changes",                # /isr_change_notification children
    "partition_reassignment",     # /admin/reassign_partitions
    "preferred_replica_election", # /admin/preferred_replica_election
    "config_changes",             # /config/changes children (topic and broker configs)
]


class ClusterStore(Protocol):
    # -- cluster -------------------------------------------------------------------------
    def cluster_id(self, proposed: str) -> str:
        """`/cluster/id`: the existing id, or `proposed` after creating it (first broker wins)."""

    # -- membership ----------------------------------------------------------------------
    def register_broker(self, registration: BrokerRegistration) -> BrokerRegistration:
        """Create the ephemeral `/brokers/ids/<id>`; returns it with its epoch. BrokerIdInUse."""

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        ...

    # -- controller ----------------------------------------------------------------------
    def elect_controller(self, broker_id: int) -> ControllerEpoch | None:
        """Try to create the ephemeral `/controller`; on success bump `/controller_epoch`
        (conditionally) and return the new epoch; None if another broker is controller."""

    def controller_id(self) -> int | None:
        ...

    def controller_epoch(self) -> ControllerEpoch | None:
        ...

    def resign_controller(self, broker_id: int) -> None:
        """Delete `/controller` if this broker holds it (controlled shutdown, session loss)."""

    # -- topics --------------------------------------------------------------------------
    def topics(self) -> dict[str, TopicAssignment]:
        ...

    def create_topic(self, assignment: TopicAssignment, configs: Mapping[str, str]) -> None:
        """`/config/topics/<t>` then `/brokers/topics/<t>` (the commit point). TopicExists."""

    def set_assignment(self, assignment: TopicAssignment, epoch: ControllerEpoch | None) -> None:
        """Replace a topic's assignment (added partitions, reassignment). `epoch` None: an
        admin request from any broker (CreatePartitions); else fenced as the controller."""

    def topic_configs(self, name: str) -> dict[str, str]:
        ...

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """`/config/topics/<t>` plus a `/config/changes` notification."""

    def config_changes(self, after: int) -> list[tuple[int, str]]:
        """The `/config/changes` notifications after sequence number `after`, oldest first:
        (sequence, entity path such as "topics/<t>", "brokers/<id>", "brokers/<default>")."""

    def purge_config_changes(self, before_ms: int) -> None:
        """Delete the notifications created before `before_ms` (wall clock), as every Kafka
        broker does with those older than 15 minutes: a broker that starts reads all configs."""

    def broker_configs(self, broker_id: int | None) -> dict[str, str]:
        """`/config/brokers/<id>`, or `/config/brokers/<default>` for None (KIP-226)."""

    def set_broker_configs(self, broker_id: int | None, configs: Mapping[str, str]) -> None:
        ...

    def group_configs(self, name: str) -> dict[str, str]:
        """`/config/groups/<g>` (KIP-848 group configs)."""

    def group_config_names(self) -> list[str]:
        """The groups that have a `/config/groups/<g>`."""

    def set_group_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """`/config/groups/<g>` plus a `/config/changes` notification; no configs: no node."""

    # -- partition state -----------------------------------------------------------------
    def partition_states(self, topic: str) -> dict[int, LeaderAndIsr]:
        ...

    def create_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch) -> dict[TopicPartition, LeaderAndIsr]:
        """Create state znodes for new partitions (fenced); returns them with versions."""

    def update_partition_state(self, partition: TopicPartition, state: LeaderAndIsr,
                               epoch: ControllerEpoch | None) -> LeaderAndIsr:
        """Conditional on `state.version`; returns the state with its new version.
        StaleVersion, ControllerMoved. `epoch` None: a leader changing its own ISR."""

    def update_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch) -> dict[TopicPartition, LeaderAndIsr | StoreError]:
        """Many controller updates at once (an election after a broker failure), each as
        `update_partition_state`: fenced, conditional on its own version, refused on its own.
        On ZooKeeper they are pipelined, as Kafka's `updateLeaderAndIsr`: one round trip's
        latency, not one per partition. Per partition: the state with its new version, or
        the StaleVersion / NoSuchTopic that refused it. ControllerMoved for the whole call."""

    # -- topic deletion ------------------------------------------------------------------
    def request_topic_deletion(self, name: str) -> None:
        """`/admin/delete_topics/<t>`: the controller deletes it everywhere, in its time."""

    def topics_to_delete(self) -> set[str]:
        ...

    def complete_topic_deletion(self, name: str, epoch: ControllerEpoch) -> None:
        """Remove the topic's znodes, its config and its deletion request (fenced)."""

    # -- notifications and admin requests ------------------------------------------------
    def notify_isr_change(self, partitions: set[TopicPartition]) -> None:
        """A sequential `/isr_change_notification/isr_change_` node listing them."""

    def take_isr_changes(self) -> set[TopicPartition]:
        """Read and delete every pending ISR change notification (controller only)."""

    def reassignment_request(self) -> dict[TopicPartition, tuple[int, ...]]:
        ...

    def request_reassignment(self, targets: Mapping[TopicPartition, tuple[int, ...]]) -> None:
        ...

    def clear_reassignment(self, done: set[TopicPartition], epoch: ControllerEpoch) -> None:
        ...

    def preferred_election_request(self) -> set[TopicPartition]:
        ...

    def request_preferred_election(self, partitions: set[TopicPartition]) -> None:
        ...

    def clear_preferred_election(self, epoch: ControllerEpoch) -> None:
        ...

    # -- producer ids --------------------------------------------------------------------
    def claim_producer_id_block(self, broker_id: int, block_size: int) -> tuple[int, int]:
        """`/latest_producer_id_block`, conditional update (seed 000); returns (first, last)."""

    # -- watches and lifecycle -----------------------------------------------------------
    def watch(self, target: WatchTarget, callback: Callable[[], None]) -> None:
        """Call `callback` (on the store's thread) after each change of `target`."""

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        """Called when the session expires: ephemeral nodes (registration, controller) are gone."""

    @property
    def connected(self) -> bool:
        """Whether the store answers now (a call made while it does not blocks until it does,
        up to the connection timeout)."""

    def close(self) -> None:
        ...
