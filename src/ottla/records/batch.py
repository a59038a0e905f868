"""Record batch v2 handled as opaque bytes.

The broker never needs the individual records of a client batch to store or serve it: the
61-byte header says everything the log needs (offsets, timestamps, producer id and sequence).
So the hot path is one `struct.unpack_from` and one CRC-32C per batch, and the patches the
broker applies (base offset, leader epoch, LogAppendTime) are written into the buffer in place.

Header layout (big endian), offsets in bytes:
    0 base_offset i64 | 8 batch_length i32 | 12 partition_leader_epoch i32 | 16 magic i8 |
    17 crc u32 | 21 attributes i16 | 23 last_offset_delta i32 | 27 first_timestamp i64 |
    35 max_timestamp i64 | 43 producer_id i64 | 51 producer_epoch i16 | 53 base_sequence i32 |
    57 records_count i32
The CRC covers bytes 21..end, so base offset and leader epoch can change without recomputing it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .crc import crc32c

from ..errors import ErrorCode, KafkaError

__all__ = [
    "BatchHeader",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "CRC_START",
    "parse_batches",
    "validate_client_batch",
    "compute_crc",
    "set_base_offset",
    "set_partition_leader_epoch",
    "set_log_append_time",
    "read_header",
]

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes batch_length does not count
MAGIC_OFFSET = 16
CRC_OFFSET = 17
CRC_START = 21  # attributes: first byte the CRC covers
MAX_TIMESTAMP_OFFSET = 35
PARTITION_LEADER_EPOCH_OFFSET = 12

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_LENGTH = struct.Struct(">qi")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

INT32_MAX = 2**31 - 1


class BatchHeader(NamedTuple):
    """One v2 batch header plus where it starts in the buffer it was read from."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; sequences wrap from Int32 max back to 0 like Kafka's."""
        if self.base_sequence < 0:
            return -1
        last = self.base_sequence + self.last_offset_delta
        return last - INT32_MAX - 1 if last > INT32_MAX else last

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return (self.attributes & TIMESTAMP_TYPE_BIT) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def read_header(buf, position: int = 0) -> BatchHeader:
    """Unpack the header at `position` without any validation."""
    return BatchHeader(position, *HEADER.unpack_from(buf, position))


def compute_crc(buf, position: int, size: int) -> int:
    """CRC-32C of a batch from its attributes to its end, as stored in the header."""
    with memoryview(buf) as view:
        return crc32c(view[position + CRC_START : position + size])


def parse_batches(buf, *, max_batch_bytes: int | None = None) -> list[BatchHeader]:
    """Walk a record set and validate every batch structurally; raise KafkaError on the first bad one.

    Kafka's rules (ByteBufferLogInputStream, UnifiedLog.analyzeAndValidateRecords): a size
    field too small or a batch running past the buffer is CORRUPT_MESSAGE, a bad CRC is
    CORRUPT_MESSAGE, a batch over max.message.bytes is MESSAGE_TOO_LARGE, and an empty record
    set is INVALID_RECORD (ProduceRequest.validateRecords). Kafka silently drops a torn tail;
    we reject it, since a produce request carries whole batches and a torn one means a broken
    client. Magic 0/1 (legacy message sets) is INVALID_RECORD, as Kafka answers produce v3+
    ("only allowed to contain record batches with magic version 2"); we serve no older produce.
    """
    end = len(buf)
    if end == 0:
        raise KafkaError(ErrorCode.invalid_record, "record set is empty")
    headers = []
    position = 0
    while position < end:
        if end - position < MAGIC_OFFSET + 1:
            raise KafkaError(ErrorCode.corrupt_message, f"truncated batch at byte {position}")
        magic = buf[position + MAGIC_OFFSET]
        if magic != 2:
            if magic in (0, 1):
                raise KafkaError(
                    ErrorCode.invalid_record, f"only record batches with magic 2 are accepted, got magic {magic}"
                )
            raise KafkaError(ErrorCode.corrupt_message, f"invalid magic {magic} at byte {position}")
        if end - position < HEADER_SIZE:
            raise KafkaError(ErrorCode.corrupt_message, f"truncated batch header at byte {position}")
        header = BatchHeader(position, *HEADER.unpack_from(buf, position))
        size = header.batch_length + LOG_OVERHEAD
        if size < HEADER_SIZE:
            raise KafkaError(ErrorCode.corrupt_message, f"batch length {header.batch_length} is too small")
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise KafkaError(
                ErrorCode.message_too_large,
                f"batch of {size} bytes exceeds max.message.bytes {max_batch_bytes}",
            )
        if position + size > end:
            raise KafkaError(ErrorCode.corrupt_message, f"batch at byte {position} runs past the record set")
        if compute_crc(buf, position, size) != header.crc:
            raise KafkaError(ErrorCode.corrupt_message, f"batch at byte {position} fails its CRC")
        headers.append(header)
        position += size
    return headers


def validate_client_batch(header: BatchHeader) -> None:
    """Kafka's LogValidator.validateBatch rules for batches coming from producers.

    Replicated and coordinator-written batches skip these: a compacted log may legitimately
    hold batches whose count no longer matches their offset range, and control batches are
    written by the broker itself.
    """
    if header.base_offset != 0:
        raise KafkaError(ErrorCode.invalid_record, f"base offset {header.base_offset} of a produced batch must be 0")
    if header.last_offset_delta < 0:
        raise KafkaError(ErrorCode.invalid_record, f"invalid last offset delta {header.last_offset_delta}")
    if header.records_count <= 0:
        raise KafkaError(ErrorCode.invalid_record, f"invalid record count {header.records_count}")
    if header.records_count != header.last_offset_delta + 1:
        raise KafkaError(
            ErrorCode.invalid_record,
            f"record count {header.records_count} does not match offset delta {header.last_offset_delta}",
        )
    if header.is_control:
        raise KafkaError(ErrorCode.invalid_record, "clients may not write control batches")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise KafkaError(
            ErrorCode.invalid_record,
            f"invalid sequence {header.base_sequence} for producer id {header.producer_id}",
        )


def set_base_offset(buf, position: int, base_offset: int) -> None:
    """Assign offsets; the CRC does not cover the base offset."""
    _I64.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf, position: int, epoch: int) -> None:
    """Stamp the leader epoch; the CRC does not cover it."""
    _I32.pack_into(buf, position + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf, position: int, size: int, timestamp: int) -> None:
    """Mark the batch LogAppendTime with `timestamp` as its max timestamp and refresh the CRC.

    Readers take every record's timestamp from the batch's max timestamp when the type is
    LogAppendTime, so the records themselves stay untouched (Kafka does the same).
    """
    attributes = _I16.unpack_from(buf, position + CRC_START)[0]
    _I16.pack_into(buf, position + CRC_START, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(buf, position + MAX_TIMESTAMP_OFFSET, timestamp)
    _U32.pack_into(buf, position + CRC_OFFSET, compute_crc(buf, position, size))

