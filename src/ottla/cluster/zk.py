"""`ClusterStore` on ZooKeeper (kazoo), with Kafka's own znode paths and JSON.

Kafka's tools and knowledge apply unchanged: `zookeeper-shell ... get /brokers/ids/1` shows
what a Kafka broker would have written. Every call blocks for one or a few round trips and
gives up after `zookeeper.connection.timeout.ms` with `StoreUnavailable`; a request that
was lost with its connection is sent again, so a conditional write whose reply
was lost may report `StaleVersion` although it applied: callers re-read, as they must after
any `StaleVersion`.

Fencing follows Kafka's `KafkaZkClient`: a controller's write is a ZooKeeper multi that
starts with a check of `/controller_epoch`'s version; the controller znode and the epoch
bump are created in one multi too, so exactly one broker wins an election.

The session, its requests and multis are `zk_session.py`'s; this module is Kafka's layout.
"""

from __future__ import annotations

import json
import threading
from typing import Callable, Mapping

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from ..producer_state.allocator import (BLOCK_SIZE, MAX_PRODUCER_ID, ProducerIdBlock, ProducerIdBlockStore,
                                        ProducerIdsExhaustedError)
from .store import (BrokerIdInUse, BrokerRegistration, ControllerEpoch, LeaderAndIsr, NoSuchTopic, StaleVersion,
                    StoreError, TopicAssignment, TopicExists, TopicPartition, WatchTarget)
from .zk_data import (BROKER_IDS, CLUSTER_ID, CONFIG_CHANGE_PREFIX, CONFIG_CHANGES, CONTROLLER, CONTROLLER_EPOCH,
                      DELETE_TOPICS, INITIAL_CONTROLLER_EPOCH, ISR_CHANGES, PERSISTENT_PATHS, PREFERRED_ELECTION,
                      PRODUCER_ID_BLOCK, REASSIGN, TOPICS, config_bytes, decode_assignment, decode_broker,
                      decode_config_change, decode_state, encode_assignment, encode_broker, encode_state, now_ms,
                      partition_list, state_path, to_json, topic_path)
from .zk_session import ZkSession


# Operations per multi: ZooKeeper refuses a request over jute.maxbuffer (1 MB), and Kafka
# itself fences each partition's write separately, so large topics take several multis.
MULTI_MAX_OPS = 1000


class ZkClusterStore(ZkSession):
    """The cluster's metadata in ZooKeeper. See `store.ClusterStore` for each method's meaning."""

    def __init__(self, connect: str, *, session_timeout_ms: int = 18000,
                 connection_timeout_ms: int | None = None):
        self._watches: list[object] = []
        self._topic_watches: dict[str, DataWatch] = {}
        self._lock = threading.Lock()
        super().__init__(connect, session_timeout_ms=session_timeout_ms,
                         connection_timeout_ms=connection_timeout_ms, persistent_paths=PERSISTENT_PATHS)

    # -- cluster ---------------------------------------------------------------------------
    def cluster_id(self, proposed: str) -> str:
        try:
            self._call("create", CLUSTER_ID, to_json({"version": "1", "id": proposed}), makepath=True)
            return proposed
        except NodeExistsError:
            return json.loads(self._get(CLUSTER_ID)[0])["id"]

    # -- membership ------------------------------------------------------------------------
    def register_broker(self, registration: BrokerRegistration) -> BrokerRegistration:
        path = f"{BROKER_IDS}/{registration.broker_id}"
        try:
            self._call("create", path, encode_broker(registration), ephemeral=True)
        except NodeExistsError:
            # Ours if a retried create had in fact applied (Kafka's checkedEphemeralCreate).
            current = self._get(path)
            if current is None or current[1].ephemeralOwner != self._zk.client_id[0]:
                raise BrokerIdInUse(f"broker.id {registration.broker_id} is registered at {path} "
                                    f"by another live broker") from None
        _, stat = self._get(path)
        return BrokerRegistration(registration.broker_id, registration.host, registration.port,
                                  registration.rack, stat.czxid)

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        children = self._children(BROKER_IDS)
        found = self._many("get", [f"{BROKER_IDS}/{child}" for child in children])
        return {int(child): decode_broker(int(child), current[0], current[1].czxid)
                for child in children if (current := found[f"{BROKER_IDS}/{child}"]) is not None}

    # -- controller ------------------------------------------------------------------------
    def elect_controller(self, broker_id: int) -> ControllerEpoch | None:
        """Kafka's registerControllerAndIncrementControllerEpoch."""
        while True:
            current = self._get(CONTROLLER_EPOCH)
            if current is None:
                try:
                    self._call("create", CONTROLLER_EPOCH, str(INITIAL_CONTROLLER_EPOCH).encode())
                except NodeExistsError:
                    pass
                continue
            epoch = int(current[0]) + 1
            controller = to_json({"version": 1, "brokerid": broker_id, "timestamp": now_ms()})

            def ops(txn):
                txn.create(CONTROLLER, controller, ephemeral=True)
                txn.set_data(CONTROLLER_EPOCH, str(epoch).encode(), version=current[1].version)
            try:
                results = self._commit(ops, None)
                return ControllerEpoch(epoch, results[1].version)
            except NodeExistsError:
                mine = self._get(CONTROLLER)
                if mine is not None and mine[1].ephemeralOwner == self._zk.client_id[0]:
                    # A retried multi that had applied: we are the controller.
                    now = self._get(CONTROLLER_EPOCH)
                    return ControllerEpoch(int(now[0]), now[1].version)
                return None
            except BadVersionError:
                continue  # the epoch moved under us; whoever moved it holds /controller

    def controller_id(self) -> int | None:
        current = self._get(CONTROLLER)
        return None if current is None else int(json.loads(current[0])["brokerid"])

    def controller_epoch(self) -> ControllerEpoch | None:
        current = self._get(CONTROLLER_EPOCH)
        return None if current is None else ControllerEpoch(int(current[0]), current[1].version)

    def resign_controller(self, broker_id: int) -> None:
        current = self._get(CONTROLLER)
        if current is not None and int(json.loads(current[0])["brokerid"]) == broker_id:
            try:
                self._call("delete", CONTROLLER, version=current[1].version)
            except (NoNodeError, BadVersionError):
                pass

    # -- topics ----------------------------------------------------------------------------
    def topics(self) -> dict[str, TopicAssignment]:
        names = self._children(TOPICS)
        found = self._many("get", [topic_path(name) for name in names])
        return {name: decode_assignment(name, current[0])
                for name in names if (current := found[topic_path(name)]) is not None}

    def create_topic(self, assignment: TopicAssignment, configs: Mapping[str, str]) -> None:
        name = assignment.name
        if self._get(f"{DELETE_TOPICS}/{name}") is not None:
            raise TopicExists(f"topic {name} is marked for deletion")
        config_path = f"/config/topics/{name}"
        config_exists = self._get(config_path) is not None  # left over from an earlier topic

        def ops(txn):
            if config_exists:
                txn.set_data(config_path, config_bytes(configs))
            else:
                txn.create(config_path, config_bytes(configs))
            txn.create(topic_path(name), encode_assignment(assignment))
        try:
            self._commit(ops, None)
        except (NodeExistsError, NoNodeError):
            raise TopicExists(f"topic {name} already exists") from None

    def set_assignment(self, assignment: TopicAssignment, epoch: ControllerEpoch | None) -> None:
        try:
            self._commit(lambda txn: txn.set_data(topic_path(assignment.name), encode_assignment(assignment)), epoch)
        except NoNodeError:
            raise NoSuchTopic(assignment.name) from None

    def _configs(self, path: str) -> dict[str, str]:
        current = self._get(path)
        return {} if current is None else dict(json.loads(current[0]).get("config") or {})

    def _set_configs(self, path: str, entity_path: str, configs: Mapping[str, str]) -> None:
        """Replace an entity's config, then announce it (Kafka's changeEntityConfig)."""
        try:
            self._call("set", path, config_bytes(configs))
        except NoNodeError:
            self._call("create", path, config_bytes(configs), makepath=True)
        self._call("create", f"{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}",
                   to_json({"version": 2, "entity_path": entity_path}), sequence=True)

    def topic_configs(self, name: str) -> dict[str, str]:
        return self._configs(f"/config/topics/{name}")

    def config_changes(self, after: int) -> list[tuple[int, str]]:
        children = sorted((int(child[len(CONFIG_CHANGE_PREFIX):]), child) for child in self._children(CONFIG_CHANGES)
                          if child.startswith(CONFIG_CHANGE_PREFIX))
        paths = {seq: f"{CONFIG_CHANGES}/{child}" for seq, child in children if seq > after}
        found = self._many("get", list(paths.values()))
        return [(seq, decode_config_change(found[path][0])) for seq, path in paths.items()
                if found[path] is not None]  # None: purged meanwhile

    def purge_config_changes(self, before_ms: int) -> None:
        paths = [f"{CONFIG_CHANGES}/{child}" for child in self._children(CONFIG_CHANGES)
                 if child.startswith(CONFIG_CHANGE_PREFIX)]
        stats = self._many("exists", paths)
        for path in paths:
            if stats[path] is not None and stats[path].ctime < before_ms:
                self._delete_if_exists(path)  # another broker may have purged it first

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        if self._get(topic_path(name)) is None:
            raise NoSuchTopic(name)
        self._set_configs(f"/config/topics/{name}", f"topics/{name}", configs)

    def broker_configs(self, broker_id: int | None) -> dict[str, str]:
        return self._configs(f"/config/brokers/{'<default>' if broker_id is None else broker_id}")

    def set_broker_configs(self, broker_id: int | None, configs: Mapping[str, str]) -> None:
        entity = "<default>" if broker_id is None else str(broker_id)
        self._set_configs(f"/config/brokers/{entity}", f"brokers/{entity}", configs)

    def group_configs(self, name: str) -> dict[str, str]:
        return self._configs(f"/config/groups/{name}")

    def group_config_names(self) -> list[str]:
        return self._children("/config/groups")

    def set_group_configs(self, name: str, configs: Mapping[str, str]) -> None:
        if configs:
            self._set_configs(f"/config/groups/{name}", f"groups/{name}", configs)
        else:  # none left: the group no longer has configs (Kafka's metadata image drops it)
            self._delete_if_exists(f"/config/groups/{name}")

    # -- partition state -------------------------------------------------------------------
    def partition_states(self, topic: str) -> dict[int, LeaderAndIsr]:
        partitions = [int(child) for child in self._children(f"{TOPICS}/{topic}/partitions")]
        found = self._many("get", [state_path(topic, p) for p in partitions])
        return {p: decode_state(current[0], current[1].version)
                for p in sorted(partitions) if (current := found[state_path(topic, p)]) is not None}

    def create_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch) -> dict[TopicPartition, LeaderAndIsr]:
        topics = sorted({topic for topic, _ in states})
        for topic, found in self._many("exists", [topic_path(t) for t in topics]).items():
            if found is None:
                raise NoSuchTopic(topic.rpartition("/")[2])
        self._many("create", [f"{TOPICS}/{t}/partitions" for t in topics])
        self._many("create", [f"{TOPICS}/{t}/partitions/{p}" for t, p in states])

        items = list(states.items())
        for start in range(0, len(items), MULTI_MAX_OPS):  # each multi fenced on its own
            def ops(txn, chunk=items[start:start + MULTI_MAX_OPS]):
                for (topic, partition), state in chunk:
                    txn.create(state_path(topic, partition), encode_state(state))
            try:
                self._commit(ops, epoch)
            except NodeExistsError:
                raise StaleVersion("a partition state already exists") from None
        return {tp: _with_version(state, 0) for tp, state in states.items()}

    def update_partition_state(self, partition: TopicPartition, state: LeaderAndIsr,
                               epoch: ControllerEpoch | None) -> LeaderAndIsr:
        outcome = self.update_partition_states({partition: state}, epoch)[partition]
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    def update_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr],
                                epoch: ControllerEpoch | None) -> dict[TopicPartition, LeaderAndIsr | StoreError]:
        """One multi per partition (epoch check, setData at the state's version), pipelined."""
        outcomes = self._commit_many(
            {tp: lambda txn, tp=tp, state=state: txn.set_data(state_path(*tp), encode_state(state),
                                                              version=state.version)
             for tp, state in states.items()}, epoch)
        out: dict[TopicPartition, LeaderAndIsr | StoreError] = {}
        for (topic, partition), outcome in outcomes.items():
            state = states[(topic, partition)]
            if isinstance(outcome, BadVersionError):
                out[(topic, partition)] = StaleVersion(f"{topic}-{partition} state is not at version {state.version}")
            elif isinstance(outcome, NoNodeError):
                out[(topic, partition)] = NoSuchTopic(f"{topic}-{partition} has no state")
            elif isinstance(outcome, Exception):
                raise outcome
            else:
                out[(topic, partition)] = _with_version(state, outcome[0].version)
        return out

    # -- topic deletion --------------------------------------------------------------------
    def request_topic_deletion(self, name: str) -> None:
        if self._get(topic_path(name)) is None:
            raise NoSuchTopic(name)
        try:
            self._call("create", f"{DELETE_TOPICS}/{name}")
        except NodeExistsError:
            pass  # already requested: the controller is on it

    def topics_to_delete(self) -> set[str]:
        return set(self._children(DELETE_TOPICS))

    def complete_topic_deletion(self, name: str, epoch: ControllerEpoch) -> None:
        doomed = []  # deepest first: a multi deletes in order and a znode with children cannot go
        bases = [f"{TOPICS}/{name}/partitions/{p}" for p in self._children(f"{TOPICS}/{name}/partitions")]
        for base, children in self._many("get_children", bases).items():
            doomed += [f"{base}/{c}" for c in children or ()] + [base]
        if self._get(f"{TOPICS}/{name}/partitions") is not None:
            doomed.append(f"{TOPICS}/{name}/partitions")
        for path in (topic_path(name), f"/config/topics/{name}", f"{DELETE_TOPICS}/{name}"):
            if self._get(path) is not None:
                doomed.append(path)

        # In order, the deletion request last: a deletion cut short is still requested.
        for start in range(0, len(doomed), MULTI_MAX_OPS):
            def ops(txn, chunk=doomed[start:start + MULTI_MAX_OPS]):
                for path in chunk:
                    txn.delete(path)
            try:
                self._commit(ops, epoch)
            except (NoNodeError, NotEmptyError):
                raise StaleVersion(f"topic {name} changed while it was being deleted") from None

    # -- notifications and admin requests --------------------------------------------------
    def notify_isr_change(self, partitions: set[TopicPartition]) -> None:
        self._call("create", f"{ISR_CHANGES}/isr_change_",
                   to_json({"version": 1, "partitions": partition_list(partitions)}), sequence=True)

    def take_isr_changes(self) -> set[TopicPartition]:
        changed = set()
        for child in sorted(self._children(ISR_CHANGES)):
            current = self._get(f"{ISR_CHANGES}/{child}")
            if current is None:
                continue
            changed |= {(e["topic"], e["partition"]) for e in json.loads(current[0])["partitions"]}
            self._delete_if_exists(f"{ISR_CHANGES}/{child}")
        return changed

    def reassignment_request(self) -> dict[TopicPartition, tuple[int, ...]]:
        current = self._get(REASSIGN)
        if current is None or not current[0]:
            return {}
        return {(e["topic"], e["partition"]): tuple(e["replicas"]) for e in json.loads(current[0])["partitions"]}

    @staticmethod
    def _reassign_json(targets: Mapping[TopicPartition, tuple[int, ...]]) -> dict | None:
        if not targets:
            return None
        return {"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": list(r)}
                                             for (t, p), r in sorted(targets.items())]}

    def request_reassignment(self, targets: Mapping[TopicPartition, tuple[int, ...]]) -> None:
        def change(data):
            merged = {(e["topic"], e["partition"]): tuple(e["replicas"]) for e in (data or {}).get("partitions", ())}
            merged.update(targets)
            return self._reassign_json(merged)
        self._update_json(REASSIGN, change)

    def _fenced_replace(self, path: str, new: Callable[[dict], dict | None], epoch: ControllerEpoch) -> None:
        """Controller's conditional rewrite (or delete, when `new` gives None) of an admin znode."""
        while True:
            current = self._get(path)
            if current is None:
                return
            data = new(json.loads(current[0]) if current[0] else {})

            def ops(txn):
                if data is None:
                    txn.delete(path, version=current[1].version)
                else:
                    txn.set_data(path, to_json(data), version=current[1].version)
            try:
                self._commit(ops, epoch)
                return
            except (BadVersionError, NoNodeError):
                continue

    def clear_reassignment(self, done: set[TopicPartition], epoch: ControllerEpoch) -> None:
        def remaining(data):
            left = {(e["topic"], e["partition"]): tuple(e["replicas"]) for e in data.get("partitions", ())}
            return self._reassign_json({tp: r for tp, r in left.items() if tp not in done})
        self._fenced_replace(REASSIGN, remaining, epoch)

    def preferred_election_request(self) -> set[TopicPartition]:
        current = self._get(PREFERRED_ELECTION)
        if current is None or not current[0]:
            return set()
        return {(e["topic"], e["partition"]) for e in json.loads(current[0])["partitions"]}

    def request_preferred_election(self, partitions: set[TopicPartition]) -> None:
        def change(data):
            merged = {(e["topic"], e["partition"]) for e in (data or {}).get("partitions", ())} | set(partitions)
            return {"version": 1, "partitions": partition_list(merged)} if merged else None
        self._update_json(PREFERRED_ELECTION, change)

    def clear_preferred_election(self, epoch: ControllerEpoch) -> None:
        self._fenced_replace(PREFERRED_ELECTION, lambda data: None, epoch)

    # -- producer ids ----------------------------------------------------------------------
    def claim_producer_id_block(self, broker_id: int, block_size: int) -> tuple[int, int]:
        """Kafka's ZkProducerIdManager.getNewProducerIdBlock: read, then conditional update."""
        while True:
            current = self._get(PRODUCER_ID_BLOCK)
            first = 0
            if current is not None and current[0]:
                first = int(json.loads(current[0])["block_end"]) + 1
            if first > MAX_PRODUCER_ID - block_size + 1:
                raise ProducerIdsExhaustedError(f"no block of {block_size} ids left after {first - 1}")
            last = first + block_size - 1
            data = to_json({"version": 1, "broker": broker_id, "block_start": str(first), "block_end": str(last)})
            try:
                if current is None:
                    self._call("create", PRODUCER_ID_BLOCK, data)
                else:
                    self._call("set", PRODUCER_ID_BLOCK, data, version=current[1].version)
                return first, last
            except (BadVersionError, NodeExistsError):
                continue  # another broker claimed a block meanwhile: claim the one after it

    # -- watches ---------------------------------------------------------------------------
    def watch(self, target: WatchTarget, callback: Callable[[], None]) -> None:
        children = {"brokers": BROKER_IDS, "topic_deletions": DELETE_TOPICS, "isr_changes": ISR_CHANGES,
                    "config_changes": CONFIG_CHANGES}
        data = {"controller": CONTROLLER, "partition_reassignment": REASSIGN,
                "preferred_replica_election": PREFERRED_ELECTION}
        if target in children:
            self._watches.append(ChildrenWatch(self._zk, children[target], _skip_first(lambda _c: callback())))
        elif target in data:
            self._watches.append(DataWatch(self._zk, data[target], _skip_first(lambda _d, _s: callback())))
        elif target == "topics":
            self._watches.append(ChildrenWatch(self._zk, TOPICS, self._topics_changed(callback)))
        else:
            raise ValueError(f"unknown watch target {target!r}")

    def _topics_changed(self, callback: Callable[[], None]) -> Callable[[list[str]], None]:
        """The topic list, and each topic's assignment (a DataWatch per topic while it exists)."""
        first = [True]

        def on_children(names: list[str]) -> None:
            with self._lock:
                for name in names:
                    if name not in self._topic_watches:
                        self._topic_watches[name] = DataWatch(self._zk, topic_path(name), on_data(name))
            if first[0]:
                first[0] = False
            else:
                callback()

        def on_data(name: str):
            initial = [True]

            def changed(data, _stat):
                if initial[0]:
                    initial[0] = False
                    return None
                if data is None:
                    with self._lock:
                        self._topic_watches.pop(name, None)
                    return False  # gone: the children watch reports it and re-adds a watch if it returns
                callback()
                return None
            return changed
        return on_children


def _with_version(state: LeaderAndIsr, version: int) -> LeaderAndIsr:
    return LeaderAndIsr(state.leader, state.leader_epoch, state.isr, state.controller_epoch, version)


def _skip_first(func: Callable) -> Callable:
    """kazoo's watchers call once at registration; the store reports changes only."""
    seen = [False]

    def wrapper(*args):
        if not seen[0]:
            seen[0] = True
            return None
        func(*args)
        return None
    return wrapper


class ZkProducerIdBlockStore(ProducerIdBlockStore):
    """Producer id blocks claimed in `/latest_producer_id_block`, unique across the cluster."""

    def __init__(self, store: ZkClusterStore, *, block_size: int = BLOCK_SIZE):
        self.store = store
        self.block_size = block_size

    def claim_next_block(self, broker_id: int) -> ProducerIdBlock:
        first, _last = self.store.claim_producer_id_block(broker_id, self.block_size)
        return ProducerIdBlock(broker_id, first, self.block_size)
