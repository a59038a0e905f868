"""What the coordinators need from the broker, as interfaces the server layer implements.

The group and transaction coordinators keep their state in an internal topic
(`__consumer_offsets`, `__transaction_state`) and own the partitions this broker leads.
They reach the broker only through these two seams, injected at construction, so they
never import the server layer and "durable" can change meaning without touching them:
today an append is acknowledged once fdatasynced and past the high watermark (one node:
at once); with replication, once the ISR has it.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Iterator, Mapping, Protocol

from ..errors import ErrorCode

TopicPartition = tuple[str, int]
# (error, base offset of the appended batch or -1)
OnDurable = Callable[[ErrorCode, int], None]
# (partition, leader epoch): the coordinator epoch of a partition is the leader epoch it was won at.
OnLeadership = Callable[[int, int], None]


class CoordinatorRuntime(Protocol):
    def ensure_topic(self, topic: str, partitions: int, configs: Mapping[str, Any]) -> int:
        """Create the internal topic unless it exists; its partition count either way."""

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count, None when it does not exist."""

    def topic_exists(self, topic: str) -> bool: ...

    def watch_leadership(self, topic: str, on_elected: OnLeadership, on_resigned: OnLeadership) -> None:
        """Call `on_elected` for each partition of `topic` this broker leads now and whenever it
        becomes leader of one; `on_resigned` when it stops leading one (Kafka's onElection /
        onResignation). The coordinator loads and unloads the partition there."""

    def append(self, topic: str, partition: int, records: bytes, on_durable: OnDurable) -> None:
        """Append a batch as this partition's leader and call `on_durable` once it is durable
        (or with the error that stopped it: NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR, ...)."""

    def read(self, topic: str, partition: int) -> Iterator[bytes]:
        """Every batch of the partition, log start to log end, as record sets of whole batches
        (opaque bytes, a bounded size each): what a load replays, in one go."""

    def load(self, topic: str, partition: int, replay: Callable[[bytes], None],
             on_loaded: Callable[[], None], prepare: Callable[[], None] | None = None) -> Callable[[], None]:
        """`read` off the event loop: hand each record set to `replay`, then call `prepare`, both
        in a worker thread, in order (so they may touch only what the load owns, never state
        requests see; `prepare` of an empty partition runs at once), then `on_loaded` on the
        event loop. Returns a function that cancels the
        load (the partition was given up before it finished); a load that fails is logged and
        never calls `on_loaded`."""

    def close(self, topic: str) -> None:
        """Make what `topic` holds durable and answer its waiting appends; from now on its
        appends are not answered (the coordinator is stopping)."""


class MarkerChannel(Protocol):
    def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                          partitions: frozenset[TopicPartition],
                          transaction_version: int = 0) -> Awaitable[dict[TopicPartition, ErrorCode]]:
        """Send WriteTxnMarkers to each partition's leader; the per-partition outcome. The
        caller retries the partitions that failed, so this sends each request once. A
        transactions-version-2 marker (WriteTxnMarkers v2) must carry an epoch above the
        partition's."""
