"""Replicas of one partition as real logs on disk, driven step by step with the replication
policy, for tests that replay replication schedules without sockets (the fetch path is the
leader's Log.read and the follower's Log.append, as the fetcher will do it)."""

from __future__ import annotations

from pathlib import Path

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode, KafkaError
from ottla.log import LogManager
from ottla.records.batch import parse_batches
from ottla.replication.epochs import epoch_end_offset
from ottla.replication.follower import FollowerFetchState
from ottla.replication.leader import LeaderState, become_leader

TOPIC = "t"


class Replica:
    """Broker `broker_id`'s copy of partition t-0: a LogManager on its own data dir, which a
    test crashes (the object is dropped without a clean shutdown, like kill -9: written bytes
    stay in the page cache) and restarts (recovery, checkpoints read back)."""

    def __init__(self, root: Path, broker_id: int):
        self.broker_id = broker_id
        self.data_dir = root / f"broker-{broker_id}"
        self.leader: LeaderState | None = None
        self.fetcher: FollowerFetchState | None = None
        self.manager: LogManager | None = None
        self._flushed_size = 0
        self.start()

    def start(self) -> None:
        self.manager = LogManager(self.data_dir, BrokerConfig(), clock=lambda: 0)
        if TOPIC not in self.manager.topics:
            self.manager.create_topic(TOPIC, 1)
        self.leader = self.fetcher = None

    def crash(self) -> None:
        self.manager = self.leader = self.fetcher = None

    def power_loss(self) -> None:
        """A machine crash: what was written since the last fsync of the active segment is gone."""
        path = self.log.active_segment.log_path
        self.crash()
        with open(path, "r+b") as f:
            f.truncate(self._flushed_size)

    def flush(self) -> None:
        """fsync; the schedules stay in one segment, so its size is what survives power loss."""
        self.log.flush()
        self._flushed_size = self.log.active_segment.size

    @property
    def log(self):
        return self.manager.get_log(TOPIC, 0)

    def checkpoint_high_watermark(self) -> None:
        self.manager.checkpoint_high_watermarks()

    # -- roles ---------------------------------------------------------------------------

    def become_leader(self, epoch: int, replicas: tuple[int, ...], isr: set[int], now_ms: int = 0) -> None:
        become_leader(self.log, epoch)
        self.fetcher = None
        self.leader = LeaderState(local_id=self.broker_id, replicas=replicas, isr=frozenset(isr), leader_epoch=epoch,
                                  high_watermark=self.log.high_watermark, log_end_offset=self.log.log_end_offset,
                                  now_ms=now_ms)
        self.log.high_watermark = self.leader.high_watermark

    def become_follower(self, leader_id: int, epoch: int) -> None:
        self.leader = None
        self.fetcher = FollowerFetchState(self.log, leader_id, epoch)

    def produce(self, records: bytes, now_ms: int = 0) -> int:
        """Append as leader; returns the offset an acks=all answer waits for (last + 1)."""
        result = self.log.append(records, now_ms=now_ms, leader_epoch=self.leader.leader_epoch)
        self.leader.on_local_append(self.log.log_end_offset)
        self.log.high_watermark = self.leader.high_watermark
        return result.last_offset + 1

    def acknowledged(self, required_offset: int) -> bool:
        return self.leader.acks_all_result(required_offset) is ErrorCode.none


def serve_fetch(leader: Replica, follower_id: int, fetch_offset: int, now_ms: int = 0):
    """The leader's side of a follower fetch: (error, records, high watermark, log start)."""
    log = leader.log
    try:
        data = log.read(fetch_offset, 1 << 20, max_offset=log.log_end_offset)
    except KafkaError as exc:
        return exc.code, b"", -1, -1
    leader.leader.on_follower_fetch(follower_id, fetch_offset, now_ms)
    log.high_watermark = leader.leader.high_watermark
    return ErrorCode.none, bytes(data.records), log.high_watermark, log.log_start_offset


def fetch(follower: Replica, leader: Replica, now_ms: int = 0, *, deliver: bool = True) -> None:
    """One fetch round trip; `deliver=False`: the follower dies before reading the response."""
    answer = serve_fetch(leader, follower.broker_id, follower.fetcher.fetch_offset, now_ms)
    if deliver:
        follower.fetcher.on_fetch_response(*answer, now_ms)


def truncate(follower: Replica, leader: Replica, now_ms: int = 0) -> None:
    """OffsetsForLeaderEpoch round trips until the follower's truncation is complete."""
    while follower.fetcher.phase.value == "truncating":
        requested = follower.fetcher.latest_epoch()
        answer = epoch_end_offset(leader.log, leader.leader.leader_epoch, requested)
        follower.fetcher.on_epoch_end_offset(ErrorCode.none, answer.leader_epoch, answer.end_offset, now_ms)


def batches(replica: Replica, upto: int | None = None) -> list[bytes]:
    """The log's batches as bytes, below `upto` (default: the log end)."""
    log = replica.log
    end = log.log_end_offset if upto is None else upto
    data = bytes(log.read(log.log_start_offset, 1 << 30, max_offset=end).records) if end > log.log_start_offset else b""
    return [data[h.position:h.position + h.size] for h in parse_batches(data)] if data else []
