"""One partition on this broker: its log, its role and the high watermark (Kafka's `Partition`).

The log stores; the partition decides. It knows whether this broker leads the partition
(and at which leader epoch), which replicas exist and which are in sync. As leader it owns a
`replication.leader.LeaderState`, the one source of truth for follower progress, the ISR
and the high watermark, and copies the HW into the log whenever that state moves it. As
follower the replica fetcher (`server/replica_fetcher.py`) drives the log and its HW.
"""

from __future__ import annotations

from enum import Enum

from ..errors import ErrorCode, KafkaError
from ..log.log import AppendResult, Log
from ..replication.leader import REPLICA_LAG_TIME_MAX_MS, FollowerProgress, LeaderState, become_leader

__all__ = ["Partition", "ReplicaRole"]


class ReplicaRole(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    NONE = "none"  # the log is here but this broker has no role (yet, or any more)


class Partition:
    def __init__(self, topic: str, index: int, log: Log, node_id: int, *,
                 lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS):
        self.topic = topic
        self.index = index
        self.log = log
        self.node_id = node_id
        self.lag_time_max_ms = lag_time_max_ms
        self.role = ReplicaRole.NONE
        self.leader_id = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        # The state znode's version and the controller epoch that wrote it: a leader's own ISR
        # change is conditional on them (Kafka's zkVersion).
        self.zk_version = -1
        self.controller_epoch = 0
        self.leader_state: LeaderState | None = None
        self._follower_isr: frozenset[int] = frozenset()

    def __repr__(self) -> str:
        return (f"Partition({self.topic}-{self.index} {self.role.value} epoch={self.leader_epoch} "
                f"leo={self.log.log_end_offset} hw={self.high_watermark})")

    @property
    def is_leader(self) -> bool:
        return self.role is ReplicaRole.LEADER

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def isr(self) -> frozenset[int]:
        return self.leader_state.isr if self.leader_state is not None else self._follower_isr

    @property
    def followers(self) -> dict[int, FollowerProgress]:
        return self.leader_state.followers if self.leader_state is not None else {}

    # -- role changes (LeaderAndIsr) -----------------------------------------------------

    def make_leader(self, leader_epoch: int, isr, replicas, *, now_ms: int, zk_version: int = -1,
                    controller_epoch: int = 0) -> bool:
        """Become (or stay) leader at `leader_epoch`; returns whether this is a new leadership.

        A new epoch starts at the log end (`become_leader`) and a fresh `LeaderState`, whose
        followers count as caught up now if they are in the ISR but hold the HW back until
        they fetch, as in Kafka. The same epoch again (a reassignment, an ISR the controller
        rewrote) keeps what the followers' fetches told.
        """
        self._check_epoch(leader_epoch)
        became = not self.is_leader or leader_epoch != self.leader_epoch
        if not became and 0 <= zk_version <= self.zk_version:
            # The same epoch from a state this leader already moved past (a new controller's
            # resend read before this leader's own ISR write landed): applying it would put
            # back the old ISR and version, and the leader would never propose the ISR
            # ZooKeeper lacks. Kafka applies an equal leader epoch only with a newer
            # partition epoch (the znode version).
            return False
        if became:
            become_leader(self.log, leader_epoch)
        previous = self.leader_state
        self.role = ReplicaRole.LEADER
        self.leader_id = self.node_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.zk_version = zk_version
        self.controller_epoch = controller_epoch
        state = LeaderState(self.node_id, self.replicas, frozenset(isr) | {self.node_id}, leader_epoch,
                            self.log.high_watermark, self.log.log_end_offset, now_ms,
                            lag_time_max_ms=self.lag_time_max_ms, min_insync_replicas=self._min_insync_replicas())
        if not became and previous is not None:
            state.epoch_start_offset = previous.epoch_start_offset
            state.high_watermark = max(state.high_watermark, previous.high_watermark)
            for replica, progress in previous.followers.items():
                if replica in state.followers:
                    state.followers[replica] = progress
            state.on_local_append(self.log.log_end_offset)
        self.leader_state = state
        self._sync_high_watermark()
        return became

    def make_follower(self, leader_epoch: int, leader_id: int, replicas=None, isr=()) -> bool:
        """Follow `leader_id` at `leader_epoch`; returns whether anything changed. The HW stays
        where it is until the leader tells otherwise; truncation is the fetcher's first step."""
        self._check_epoch(leader_epoch)
        changed = self.role is not ReplicaRole.FOLLOWER or self.leader_epoch != leader_epoch or self.leader_id != leader_id
        self.role = ReplicaRole.FOLLOWER
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        if replicas is not None:
            self.replicas = tuple(replicas)
        self._follower_isr = frozenset(isr)
        self.leader_state = None
        return changed

    def _check_epoch(self, leader_epoch: int) -> None:
        # Kafka's LeaderAndIsr answer for a request older than what this replica already saw.
        if leader_epoch < self.leader_epoch:
            raise KafkaError(ErrorCode.fenced_leader_epoch,
                             f"leader epoch {leader_epoch} of {self.topic}-{self.index} is older than {self.leader_epoch}")

    def make_offline(self) -> None:
        """StopReplica without deletion: keep the log, give up the role."""
        self.role = ReplicaRole.NONE
        self.leader_id = -1
        self.leader_state = None
        self._follower_isr = frozenset()

    # -- appends and the high watermark --------------------------------------------------

    def check_leader(self) -> None:
        if not self.is_leader:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.node_id} is not the leader of {self.topic}-{self.index}")

    def _min_insync_replicas(self) -> int:
        return self.log.config["min.insync.replicas"]

    def check_enough_replicas(self, acks: int) -> None:
        """NOT_ENOUGH_REPLICAS before an acks=all append when the ISR is below
        min.insync.replicas (the topic's config, read now: AlterConfigs applies at once)."""
        self.check_leader()
        self.leader_state.min_insync_replicas = self._min_insync_replicas()
        self.leader_state.check_enough_replicas(acks)

    def acks_all_result(self, required_offset: int) -> ErrorCode | None:
        """None while the HW is below `required_offset`; then NONE, or
        NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below min.insync.replicas."""
        if self.leader_state is None:
            return ErrorCode.not_leader_or_follower
        self.leader_state.min_insync_replicas = self._min_insync_replicas()
        return self.leader_state.acks_all_result(required_offset)

    def append_as_leader(self, records, *, now_ms: int, origin: str) -> AppendResult:
        """Append on the leader, stamping the batches with the leader epoch; the HW then moves
        as far as the ISR allows (at once when this broker is the whole ISR)."""
        self.check_leader()
        result = self.log.append(records, now_ms=now_ms, origin=origin, leader_epoch=max(self.leader_epoch, 0))
        if not result.duplicate:
            self.leader_state.on_local_append(self.log.log_end_offset)
            self._sync_high_watermark()
        return result

    def _sync_high_watermark(self) -> bool:
        """Copy the leader state's HW into the log; returns whether the log's HW moved."""
        before = self.log.high_watermark
        if self.leader_state.high_watermark > before:
            self.log.update_high_watermark(self.leader_state.high_watermark)
        return self.log.high_watermark != before

    def update_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from `fetch_offset` (it holds everything below): returns whether
        the HW moved. NOT_LEADER_OR_FOLLOWER for a broker that is no replica."""
        self.check_leader()
        self.leader_state.on_follower_fetch(replica_id, fetch_offset, now_ms)
        return self._sync_high_watermark()

    # -- ISR changes (written by the leader, conditionally, server/isr_updates.py) --------

    def propose_isr_shrink(self, now_ms: int) -> frozenset[int] | None:
        return self.leader_state.propose_isr_shrink(now_ms) if self.leader_state is not None else None

    def propose_isr_expand(self) -> frozenset[int] | None:
        return self.leader_state.propose_isr_expand() if self.leader_state is not None else None

    def isr_committed(self, isr, zk_version: int) -> bool:
        """The store accepted `isr` at `zk_version`; returns whether the HW moved."""
        if self.leader_state is None:
            return False
        self.zk_version = zk_version
        self.leader_state.isr_committed(isr)
        return self._sync_high_watermark()

    def isr_change_failed(self) -> None:
        if self.leader_state is not None:
            self.leader_state.isr_change_failed()
