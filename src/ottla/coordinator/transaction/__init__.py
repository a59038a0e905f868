"""The transaction coordinator (KIP-98): `__transaction_state` records and the state machine."""

from .contracts import (
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerWriter,
    TxnDescription,
    TxnListing,
    TxnLogStore,
)
from .coordinator import TransactionCoordinator
from .metadata import EndTxnResult
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
