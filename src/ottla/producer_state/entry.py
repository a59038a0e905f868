"""What the broker remembers about one producer on one partition.

Values are immutable: validation builds new entries beside the live ones, so a rejected
append cannot leave half-updated state behind, and a plan's entries can be installed as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

INT32_MAX = 2**31 - 1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_COORDINATOR_EPOCH = -1


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether `next_seq` directly follows `last_seq`; sequences wrap from Int32 max to 0.

    With no sequence yet (`NO_SEQUENCE`) only 0 follows, which is what a fresh epoch needs.
    """
    return next_seq == last_seq + 1 or (last_seq == INT32_MAX and next_seq == 0)


class BatchMetadata(NamedTuple):
    """One appended batch, kept so a retried batch can be answered with its original offsets."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True)
class ProducerEntry:
    """State of one producer id.

    `batches` holds the most recent batches of the current epoch, oldest first; a new epoch
    starts with none. `last_offset` is the offset of the producer's latest batch, data or
    marker: once retention deletes it, nothing in the log speaks for the producer any more.
    `txn_first_offset` is the first offset of its ongoing transaction, None outside one.
    """

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: tuple[BatchMetadata, ...] = ()
    last_timestamp: int = -1
    last_offset: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    txn_first_offset: int | None = None

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_batch(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range, if any."""
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None
