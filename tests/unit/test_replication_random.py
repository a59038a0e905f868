"""Random schedules of produce, fetch, ISR shrink, kill -9 and restart on three real logs
with the replication policy and a minimal controller (elects from the live ISR, drops dead
replicas from the ISR, keeps a partition offline rather than elect outside it). Whatever the
schedule (also followers bounced faster than the controller notices, which come back in the
ISR), no acknowledged record is lost or moved, and once every replica is back and caught
up all three logs are identical batch by batch."""

from __future__ import annotations

import random

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.records.records import Record, build_batch, iter_batches
from ottla.replication.follower import FetchPhase
from ottla.replication.leader import REPLICA_LAG_TIME_MAX_MS
from tests.replicas import Replica, batches, serve_fetch, truncate

IDS = (1, 2, 3)
MIN_ISR = 2


class Cluster:
    def __init__(self, tmp_path, rng: random.Random):
        self.rng = rng
        self.replicas = {i: Replica(tmp_path, i) for i in IDS}
        self.alive = set(IDS)
        self.isr = set(IDS)
        self.leader_id: int | None = None
        self.epoch = -1
        self.now = 0
        self.pending: list[tuple[int, bytes]] = []  # (required offset, value) awaiting acks=all
        self.acked: dict[int, bytes] = {}  # offset -> value
        self.sent = 0
        self.elect(1)

    # -- the controller ------------------------------------------------------------------

    def elect(self, leader_id: int | None) -> None:
        self.pending.clear()  # in-flight produce requests die with the old leader
        self.leader_id = leader_id
        if leader_id is None:
            return
        self.epoch += 1
        leader = self.replicas[leader_id]
        leader.become_leader(self.epoch, IDS, self.isr, now_ms=self.now)
        leader.leader.min_insync_replicas = MIN_ISR
        for i in self.alive - {leader_id}:
            self.replicas[i].become_follower(leader_id, self.epoch)
        self.check_acked_on(leader)

    def set_isr(self, isr: set[int]) -> None:
        self.isr = set(isr)
        if self.leader_id is not None:
            self.replicas[self.leader_id].leader.isr_committed(self.isr)
            self.sync_hw()

    def sync_hw(self) -> None:
        leader = self.replicas[self.leader_id]
        leader.log.high_watermark = leader.leader.high_watermark

    # -- steps ---------------------------------------------------------------------------

    def produce(self) -> None:
        if self.leader_id is None:
            return
        leader = self.replicas[self.leader_id]
        try:
            leader.leader.check_enough_replicas(-1)
        except KafkaError as exc:
            assert exc.code is ErrorCode.not_enough_replicas and len(self.isr) < MIN_ISR
            return
        self.sent += 1
        value = b"v%d" % self.sent
        required = leader.produce(build_batch([Record(None, value, (), 1_000)]), now_ms=self.now)
        self.pending.append((required, value))
        self.collect_acks()

    def collect_acks(self) -> None:
        leader = self.replicas[self.leader_id].leader
        still = []
        for required, value in self.pending:
            result = leader.acks_all_result(required)
            if result is None:
                still.append((required, value))
            elif result is ErrorCode.none:
                assert len(self.isr) >= MIN_ISR
                self.acked[required - 1] = value
        self.pending = still

    def fetch(self, follower_id: int) -> None:
        if self.leader_id is None or follower_id == self.leader_id or follower_id not in self.alive:
            return
        follower, leader = self.replicas[follower_id], self.replicas[self.leader_id]
        if follower.fetcher is None:
            return
        if follower.fetcher.phase is FetchPhase.TRUNCATING:
            truncate(follower, leader)
            return
        if follower.fetcher.phase is FetchPhase.RESETTING:
            follower.fetcher.on_leader_offsets(ErrorCode.none, leader.log.log_start_offset,
                                               leader.log.log_end_offset, self.now)
            return
        answer = serve_fetch(leader, follower_id, follower.fetcher.fetch_offset, self.now)
        follower.fetcher.on_fetch_response(*answer, self.now)
        self.sync_hw()
        proposal = leader.leader.propose_isr_expand()
        if proposal is not None:
            self.set_isr(proposal)
        self.collect_acks()

    def tick(self) -> None:
        self.now += self.rng.choice((1_000, 5_000, 10_000, REPLICA_LAG_TIME_MAX_MS + 1))
        if self.leader_id is None:
            return
        proposal = self.replicas[self.leader_id].leader.propose_isr_shrink(self.now)
        if proposal is not None:
            self.set_isr(proposal)
            self.collect_acks()

    def crash(self, replica_id: int) -> None:
        if replica_id not in self.alive:
            return
        self.alive.discard(replica_id)
        self.replicas[replica_id].crash()
        remaining = self.isr - {replica_id}
        if replica_id == self.leader_id:
            live_isr = sorted(remaining & self.alive)
            if live_isr:
                self.isr = remaining
                self.elect(live_isr[0])
            else:  # unclean.leader.election.enable=false: offline, the ISR keeps its last member
                self.elect(None)
        elif remaining:
            self.set_isr(remaining)

    def restart(self, replica_id: int) -> None:
        if replica_id in self.alive:
            return
        replica = self.replicas[replica_id]
        replica.start()
        self.alive.add(replica_id)
        if self.leader_id is None:
            if replica_id in self.isr:
                self.elect(replica_id)
        else:
            replica.become_follower(self.leader_id, self.epoch)

    def bounce(self, replica_id: int) -> None:
        """kill -9 and restart of a follower faster than the controller notices (within the
        ZooKeeper session timeout): it comes back still in the ISR, seed 001's first schedule."""
        if replica_id == self.leader_id or replica_id not in self.alive:
            return
        replica = self.replicas[replica_id]
        replica.crash()
        replica.start()
        if self.leader_id is not None:
            replica.become_follower(self.leader_id, self.epoch)

    def checkpoint(self, replica_id: int) -> None:
        if replica_id in self.alive:
            self.replicas[replica_id].checkpoint_high_watermark()

    # -- checks --------------------------------------------------------------------------

    def check_acked_on(self, replica: Replica) -> None:
        """Every acknowledged record is in the leader's log, at the offset it was given."""
        found = {r.offset: r.value for b in batches(replica) for _, rs in iter_batches(b) for r in rs}
        for offset, value in self.acked.items():
            assert found.get(offset) == value, f"acknowledged {value!r} at {offset} lost on {replica.broker_id}"

    def heal(self) -> None:
        """Everyone back, fetching until caught up and in the ISR."""
        for i in IDS:
            self.restart(i)
        if self.leader_id is None:
            self.elect(sorted(self.isr)[0])
        for _ in range(20):
            for i in IDS:
                self.fetch(i)
            self.now += 1
        assert self.isr == set(IDS)


def written_epochs(replica: Replica):
    """The cache's entries for epochs that wrote something (a leader's own epoch starts at its
    log end on election, before it writes: its followers learn of it from its batches)."""
    log = replica.log
    return [e for e in log.leader_epoch_cache.entries if e.start_offset < log.log_end_offset]


def step(cluster: Cluster, rng: random.Random) -> None:
    action = rng.choices(["produce", "fetch", "tick", "crash", "restart", "bounce", "checkpoint"],
                         weights=[30, 50, 4, 3, 6, 3, 3])[0]
    if action == "produce":
        cluster.produce()
    elif action == "tick":
        cluster.tick()
    else:
        getattr(cluster, action)(rng.choice(IDS))


@pytest.mark.parametrize("seed", range(32))
def test_random_schedules_keep_acknowledged_records_and_converge(tmp_path, seed):
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, rng)
    for _ in range(250):
        step(cluster, rng)
    cluster.heal()
    leader = cluster.replicas[cluster.leader_id]
    for replica in cluster.replicas.values():
        cluster.check_acked_on(replica)
        assert batches(replica) == batches(leader)
        assert written_epochs(replica) == written_epochs(leader)
    assert leader.log.high_watermark == leader.log.log_end_offset
    assert cluster.acked, "the schedule acknowledged nothing: it tests nothing"
