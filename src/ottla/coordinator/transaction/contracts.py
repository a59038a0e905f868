"""What the transaction coordinator needs from the broker (`TxnLogStore`, `MarkerWriter`) and the
results it answers with: the seams between the state machine and the broker, so unit tests can drive the
coordinator with in-memory fakes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from ...errors import ErrorCode
from .log_format import TopicPartition
from .metadata import TxnMetadata


class TxnLogStore(Protocol):
    """The `__transaction_state` topic as the coordinator sees it."""

    def append(self, partition: int, key: bytes, value: bytes | None,
               on_durable: Callable[[ErrorCode], None]) -> None:
        """Append one record (value None = tombstone); call `on_durable` once it is durable
        (acks=all) with ErrorCode.none, or with the append's error."""

    def load(self, partition: int, on_loaded: Callable[[Mapping[str, TxnMetadata]], None]) -> None:
        """Read the partition from its start to its end and hand over each id's state
        (`metadata.loaded_txns` of its records)."""


class MarkerWriter(Protocol):
    """Writes COMMIT/ABORT control batches (WriteTxnMarkers) to a transaction's partitions."""

    def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                      commit: bool, partitions: frozenset[TopicPartition],
                      on_done: Callable[[ErrorCode], None], transaction_version: int = 0) -> None:
        """Call `on_done(ErrorCode.none)` once every partition has the marker (retrying
        retriable errors and skipping partitions whose topic was deleted), or with
        TRANSACTION_COORDINATOR_FENCED / INVALID_PRODUCER_EPOCH if a newer coordinator or
        producer epoch makes this completion moot."""


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResult:
    error: ErrorCode
    unknown_state_filters: tuple[str, ...] = ()
    transactions: tuple[TxnListing, ...] = ()


@dataclass(frozen=True, slots=True)
class TxnDescription:
    transactional_id: str
    error: ErrorCode
    state: str = ""
    timeout_ms: int = 0
    start_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    partitions: frozenset[TopicPartition] = frozenset()
