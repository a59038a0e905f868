"""One partition on this broker: its log, its role and the high watermark (Kafka's `Partition`).

The log stores; the partition decides. It knows whether this broker leads the partition
(and at which leader epoch), which replicas exist and which are in sync, and it alone moves
the high watermark: as leader, to the smallest log end offset over the ISR (one node: its
own LEO); as follower, to what the leader reports. Replication (fetchers, ISR shrink and
expand, the HW and leader-epoch checkpoints) builds on `make_leader`, `make_follower`,
`update_follower_fetch` and `follower_high_watermark` without changing this contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import ErrorCode, KafkaError
from ..log.log import AppendResult, Log

__all__ = ["Partition", "ReplicaRole", "FollowerState"]


class ReplicaRole(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    NONE = "none"  # the log is here but this broker has no role (yet, or any more)


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower, from its fetches (Kafka's `Replica`)."""

    log_end_offset: int = -1
    last_caught_up_ms: int = -1


class Partition:
    def __init__(self, topic: str, index: int, log: Log, node_id: int):
        self.topic = topic
        self.index = index
        self.log = log
        self.node_id = node_id
        self.role = ReplicaRole.NONE
        self.leader_id = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self.followers: dict[int, FollowerState] = {}

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

    # -- role changes (LeaderAndIsr) -----------------------------------------------------

    def make_leader(self, leader_epoch: int, isr, replicas) -> bool:
        """Become (or stay) leader at `leader_epoch`; returns whether this is a new leadership.

        Followers' states start unknown, as in Kafka: until they fetch, they hold the HW back
        only if they are in the ISR.
        """
        self._check_epoch(leader_epoch)
        became = not self.is_leader or leader_epoch != self.leader_epoch
        self.role = ReplicaRole.LEADER
        self.leader_id = self.node_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr)
        self.followers = {r: self.followers.get(r, FollowerState()) if not became else FollowerState()
                          for r in self.replicas if r != self.node_id}
        self.maybe_increment_high_watermark()
        return became

    def make_follower(self, leader_epoch: int, leader_id: int, replicas=None) -> bool:
        """Follow `leader_id` at `leader_epoch`; returns whether anything changed. The HW stays
        where it is until the leader tells otherwise; truncation is replication's step."""
        self._check_epoch(leader_epoch)
        changed = self.role is not ReplicaRole.FOLLOWER or self.leader_epoch != leader_epoch or self.leader_id != leader_id
        self.role = ReplicaRole.FOLLOWER
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        if replicas is not None:
            self.replicas = tuple(replicas)
        self.isr = frozenset()
        self.followers = {}
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
        self.isr = frozenset()
        self.followers = {}

    # -- appends and the high watermark --------------------------------------------------

    def check_leader(self) -> None:
        if not self.is_leader:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.node_id} is not the leader of {self.topic}-{self.index}")

    def append_as_leader(self, records, *, now_ms: int, origin: str) -> AppendResult:
        """Append on the leader, stamping the batches with the leader epoch; the HW then moves
        as far as the ISR allows (at once when this broker is the whole ISR)."""
        self.check_leader()
        result = self.log.append(records, now_ms=now_ms, origin=origin, leader_epoch=max(self.leader_epoch, 0))
        if not result.duplicate:
            self.maybe_increment_high_watermark()
        return result

    def maybe_increment_high_watermark(self) -> bool:
        """Leader only: HW = min LEO over the ISR (this broker's LEO for itself); never backwards."""
        if not self.is_leader:
            return False
        candidate = self.log.log_end_offset
        for replica in self.isr:
            if replica != self.node_id:
                state = self.followers.get(replica)
                candidate = min(candidate, state.log_end_offset if state is not None else -1)
        if candidate > self.log.high_watermark:
            self.log.update_high_watermark(candidate)
            return True
        return False

    def update_follower_fetch(self, replica_id: int, log_end_offset: int, now_ms: int) -> bool:
        """A follower fetched from `log_end_offset`: record it, and move the HW if it can.
        (ISR expansion and shrinking by `replica.lag.time.max.ms` belong to replication.)"""
        state = self.followers.get(replica_id)
        if state is None:
            raise KafkaError(ErrorCode.not_leader_or_follower, f"{replica_id} is not a replica of {self.topic}-{self.index}")
        state.log_end_offset = log_end_offset
        if log_end_offset >= self.log.log_end_offset:
            state.last_caught_up_ms = now_ms
        return self.maybe_increment_high_watermark()

    def follower_high_watermark(self, leader_high_watermark: int) -> int:
        """Follower: the HW is the leader's, bounded by what this replica holds."""
        return self.log.update_high_watermark(min(leader_high_watermark, self.log.log_end_offset))
