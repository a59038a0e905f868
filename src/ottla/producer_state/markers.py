"""Transaction markers as producer state receives them.

A control batch's header does not say whether it commits or aborts, nor which coordinator
epoch wrote it: both live in its one control record (decoded by `ottla.records.control`).
Producer state needs both, to report aborted transactions and to fence zombie coordinators,
so the log hands control batches over as `ControlBatch(header, marker)`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ErrorCode, KafkaError
from ..records.batch import BatchHeader
from ..records.control import EndTxnMarker, parse_control_batch

__all__ = ["ControlBatch", "EndTxnMarker", "read_end_txn_marker"]


class ControlBatch(NamedTuple):
    """A control batch's header together with the marker its record holds."""

    header: BatchHeader
    marker: EndTxnMarker


def read_end_txn_marker(buf, header: BatchHeader) -> EndTxnMarker:
    """The COMMIT or ABORT marker of the control batch at `header.position` in `buf`.

    Any other control record is CORRUPT_MESSAGE: only transaction markers belong in a
    partition that carries producer state.
    """
    if not header.is_control:
        raise ValueError(f"batch at offset {header.base_offset} is not a control batch")
    marker = parse_control_batch(buf, header)
    if marker is None:
        raise KafkaError(
            ErrorCode.corrupt_message, f"control batch at offset {header.base_offset} is no transaction marker"
        )
    return marker
