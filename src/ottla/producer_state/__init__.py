"""Broker-side producer state: sequence checks, transactions, snapshots, producer ids.

Where Kafka versions differ we follow the idempotent-producer design the project started
from (Kafka 0.11-2.4) in one respect: a producer the partition has no state for must start
at sequence 0, else UNKNOWN_PRODUCER_ID. Kafka 2.5+ (KIP-360) accepts any sequence there,
trading gap detection for fewer client resets.
"""

from .allocator import (
    BLOCK_SIZE,
    STORE_FILE_NAME,
    FileProducerIdBlockStore,
    ProducerIdBlock,
    ProducerIdBlockStore,
    ProducerIdManager,
    ProducerIdsExhaustedError,
)
from .entry import BatchMetadata, ProducerEntry
from .manager import ActiveProducer, AppendPlan, CompletedTxn, ProducerStateManager
from .markers import ControlBatch, EndTxnMarker, read_end_txn_marker

__all__ = [
    "ActiveProducer",
    "AppendPlan",
    "BLOCK_SIZE",
    "BatchMetadata",
    "CompletedTxn",
    "ControlBatch",
    "EndTxnMarker",
    "FileProducerIdBlockStore",
    "ProducerEntry",
    "ProducerIdBlock",
    "ProducerIdBlockStore",
    "ProducerIdManager",
    "ProducerIdsExhaustedError",
    "ProducerStateManager",
    "STORE_FILE_NAME",
    "read_end_txn_marker",
]
