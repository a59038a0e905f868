"""Transaction markers: the control batches that end a transaction in each partition.

Key: version i16 (0) | type i16 (0 ABORT, 1 COMMIT). Value: version i16 (0) | coordinator_epoch i32.
A marker batch is transactional and control, carries the producer id and epoch, no sequence.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import ErrorCode, KafkaError
from .batch import BatchHeader
from .records import Record, build_batch, decode_batch

__all__ = ["ABORT", "COMMIT", "EndTxnMarker", "build_control_batch", "parse_control_batch", "control_type"]

ABORT = 0
COMMIT = 1

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class EndTxnMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def build_control_batch(
    producer_id: int, epoch: int, coordinator_epoch: int, commit: bool, timestamp: int
) -> bytes:
    """One-record COMMIT or ABORT marker batch at base offset 0 (the log assigns the offset)."""
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [Record(key, value, (), timestamp)],
        producer_id=producer_id,
        producer_epoch=epoch,
        is_transactional=True,
        is_control=True,
        now_ms=timestamp,
    )


def control_type(key: bytes | None) -> int:
    """The control record type from a control record key; CORRUPT_MESSAGE if it is malformed."""
    if key is None or len(key) < _KEY.size:
        raise KafkaError(ErrorCode.corrupt_message, "control record key too short")
    return _KEY.unpack_from(key)[1]


def parse_control_batch(buf, header: BatchHeader) -> EndTxnMarker | None:
    """The marker in a control batch, or None for control types other than COMMIT/ABORT."""
    records = decode_batch(buf, header)
    if len(records) != 1:
        raise KafkaError(ErrorCode.corrupt_message, "a control batch must hold exactly one record")
    record = records[0]
    kind = control_type(record.key)
    if kind not in (ABORT, COMMIT):
        return None
    if record.value is None or len(record.value) < _VALUE.size:
        raise KafkaError(ErrorCode.corrupt_message, "end transaction marker value too short")
    _, coordinator_epoch = _VALUE.unpack_from(record.value)
    return EndTxnMarker(kind == COMMIT, coordinator_epoch)
