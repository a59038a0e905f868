"""The transaction coordinator (KIP-98): `__transaction_state` records and the state machine."""

from .coordinator import (
    EndTxnResult,
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerWriter,
    TransactionCoordinator,
    TxnDescription,
    TxnListing,
    TxnLogStore,
)
from ..partitioning import partition_for
from .log_format import TRANSACTION_STATE_TOPIC, TopicPartition, TxnState

__all__ = [
    "EndTxnResult",
    "InitProducerIdResult",
    "ListTransactionsResult",
    "MarkerWriter",
    "TRANSACTION_STATE_TOPIC",
    "TopicPartition",
    "TransactionCoordinator",
    "TxnDescription",
    "TxnListing",
    "TxnLogStore",
    "TxnState",
    "partition_for",
]
