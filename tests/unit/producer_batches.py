"""Batch headers as the log hands them to the producer state manager, for its unit tests."""

from ottla.producer_state import ControlBatch, EndTxnMarker
from ottla.records.batch import HEADER_SIZE, BatchHeader

NOW = 1_700_000_000_000


def data(pid, epoch, seq, offset, count=1, *, txn=False, ts=NOW):
    """A v2 data batch header with its offsets already assigned."""
    return BatchHeader(
        position=0,
        base_offset=offset,
        batch_length=HEADER_SIZE - 12,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=0x10 if txn else 0,
        last_offset_delta=count - 1,
        first_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        records_count=count,
    )


def marker(pid, epoch, offset, *, abort=False, coordinator_epoch=0, ts=NOW):
    """A COMMIT (or ABORT) control batch for `pid`."""
    header = data(pid, epoch, -1, offset, txn=True, ts=ts)._replace(attributes=0x30)
    return ControlBatch(header, EndTxnMarker(commit=not abort, coordinator_epoch=coordinator_epoch))
