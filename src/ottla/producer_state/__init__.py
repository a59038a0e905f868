"""Broker-side producer state: sequence checks, transactions, snapshots, producer ids.

Deliberate differences from current Kafka:
- A producer the partition has no state for must start at sequence 0, else
  UNKNOWN_PRODUCER_ID, as in the idempotence design (Kafka 0.11-2.4). Kafka 2.5+ (KIP-360)
  accepts any sequence there, trading gap detection for fewer client resets.
- Likewise, a producer whose last batch retention deleted is forgotten; Kafka 3.x keeps
  it in memory until it expires.
- Expiry and DescribeProducers' last timestamp use the broker's clock at append, not the
  batch's CreateTime, so a producer writing old timestamps does not expire at once.
- Snapshots keep all retained batches per producer, not only the last one, so in-flight
  retries are still recognised as duplicates after a restart.
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
