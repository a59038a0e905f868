"""Decoding and building the records inside a v2 batch.

This is the slow path: the CLI, the internal topics (__consumer_offsets,
__transaction_state), control markers and broker-side recompression. Client batches on the
produce/fetch path never come through here.

Record layout: length varint | attributes i8 | timestamp_delta varlong | offset_delta varint |
key_length varint | key | value_length varint | value | header_count varint |
(header_key_length varint | header_key utf-8 | header_value_length varint | header_value)*
Varints are zigzag-encoded; a length of -1 means null.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator, NamedTuple, Sequence

from ..errors import ErrorCode, KafkaError
from .batch import (
    CONTROL_BIT,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    compute_crc,
    read_header,
)
from .compression import CODEC_IDS, NONE, compress, decompress

__all__ = [
    "Record",
    "build_batch",
    "decode_batch",
    "iter_batches",
    "rebuild_batch",
    "keys_present",
    "encode_varint",
    "decode_varint",
    "decode_bytes",
]

Header = tuple[str, "bytes | None"]


class Record(NamedTuple):
    """A record as the application sees it. `offset` is -1 until the record is read from a log;
    `timestamp` -1 when building means "now"."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = -1
    offset: int = -1


def encode_varint(value: int, out: bytearray) -> None:
    """Append a zigzag varint (Kafka's varint and varlong share the encoding)."""
    value = (value << 1) ^ (value >> 63)
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def decode_varint(buf, position: int) -> tuple[int, int]:
    """Read a zigzag varint at `position`; returns (value, next position)."""
    byte = buf[position]
    position += 1
    raw = byte & 0x7F
    shift = 7
    while byte & 0x80:
        byte = buf[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")
    return (raw >> 1) ^ -(raw & 1), position


def _encode_bytes(value: bytes | None, out: bytearray) -> None:
    if value is None:
        encode_varint(-1, out)
    else:
        encode_varint(len(value), out)
        out += value


def _encode_record(record: Record, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # attributes: unused in v2
    encode_varint(timestamp_delta, body)
    encode_varint(offset_delta, body)
    _encode_bytes(record.key, body)
    _encode_bytes(record.value, body)
    encode_varint(len(record.headers), body)
    for name, value in record.headers:
        _encode_bytes(name.encode() if isinstance(name, str) else name, body)
        _encode_bytes(value, body)
    out = bytearray()
    encode_varint(len(body), out)
    out += body
    return bytes(out)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: int | str | None = None,
    timestamp_type: int = 0,
    partition_leader_epoch: int = -1,
    now_ms: int | None = None,
) -> bytes:
    """Encode `records` as one v2 batch with a valid CRC; records without a timestamp get `now_ms`.

    `compression` is a codec id, a topic-config name ("gzip", "uncompressed", ...) or None.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    if compression is None:
        compression = NONE
    elif isinstance(compression, str):
        compression = CODEC_IDS[compression]
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    timestamps = [r.timestamp if r.timestamp >= 0 else now_ms for r in records]
    first_timestamp = timestamps[0]
    body = b"".join(
        _encode_record(record, delta, ts - first_timestamp)
        for delta, (record, ts) in enumerate(zip(records, timestamps))
    )
    body = compress(compression, body)
    attributes = compression
    if timestamp_type:
        attributes |= TIMESTAMP_TYPE_BIT
    if is_transactional:
        attributes |= TRANSACTIONAL_BIT
    if is_control:
        attributes |= CONTROL_BIT
    size = HEADER_SIZE + len(body)
    buf = bytearray(size)
    HEADER.pack_into(
        buf,
        0,
        base_offset,
        size - LOG_OVERHEAD,
        partition_leader_epoch,
        2,
        0,
        attributes,
        len(records) - 1,
        first_timestamp,
        max(timestamps),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    buf[HEADER_SIZE:] = body
    buf[17:CRC_START] = compute_crc(buf, 0, size).to_bytes(4, "big")
    return bytes(buf)


def decode_batch(buf, header: BatchHeader | None = None) -> list[Record]:
    """The records of the batch at `header.position` (or at 0), with absolute offsets and timestamps.

    For LogAppendTime batches every record carries the batch's max timestamp, as Kafka readers do.
    """
    if header is None:
        header = read_header(buf, 0)
    start = header.position + HEADER_SIZE
    end = header.position + header.size
    with memoryview(buf) as view:
        data = decompress(header.compression, view[start:end])
    try:
        return _decode_records(data, header)
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise KafkaError(
            ErrorCode.corrupt_message, f"malformed record in batch at offset {header.base_offset}: {exc}"
        ) from None


def decode_bytes(data, position: int) -> tuple[bytes | None, int]:
    length, position = decode_varint(data, position)
    if length < 0:
        return None, position
    end = position + length
    if end > len(data):
        raise ValueError("field runs past the batch")
    return bytes(data[position:end]), end


def _decode_records(data: bytes, header: BatchHeader) -> list[Record]:
    log_append_time = header.timestamp_type == 1
    records = []
    position = 0
    for _ in range(header.records_count):
        length, position = decode_varint(data, position)
        end = position + length
        if length < 0 or end > len(data):
            raise ValueError("record runs past the batch")
        position += 1  # attributes
        timestamp_delta, position = decode_varint(data, position)
        offset_delta, position = decode_varint(data, position)
        key, position = decode_bytes(data, position)
        value, position = decode_bytes(data, position)
        header_count, position = decode_varint(data, position)
        if header_count < 0:  # Kafka: "Found invalid number of record headers"
            raise ValueError("negative header count")
        headers = []
        for _ in range(header_count):
            name, position = decode_bytes(data, position)
            header_value, position = decode_bytes(data, position)
            if name is None:
                raise ValueError("null header key")
            headers.append((name.decode(), header_value))
        if position != end:
            raise ValueError("record length does not match its fields")
        timestamp = header.max_timestamp if log_append_time else header.first_timestamp + timestamp_delta
        records.append(Record(key, value, tuple(headers), timestamp, header.base_offset + offset_delta))
    if position != len(data):
        raise ValueError("bytes left after the declared record count")
    return records


def iter_batches(buf) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Decode every whole batch in a record set (e.g. fetched data), ignoring a torn tail."""
    position = 0
    end = len(buf)
    while end - position >= HEADER_SIZE:
        header = read_header(buf, position)
        if header.size < HEADER_SIZE or position + header.size > end:
            return
        yield header, decode_batch(buf, header)
        position += header.size


def rebuild_batch(buf, header: BatchHeader, compression: int) -> bytes:
    """Re-encode one batch with another codec, keeping producer fields and timestamps.

    Broker-side recompression for a topic whose `compression.type` is not "producer".
    """
    records = decode_batch(buf, header)
    return build_batch(
        records,
        base_offset=header.base_offset,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
        compression=compression,
        timestamp_type=header.timestamp_type,
        partition_leader_epoch=header.partition_leader_epoch,
    )


def keys_present(buf, headers: Iterable[BatchHeader]) -> bool:
    """Whether every record has a non-null key (compacted topics require one)."""
    return all(r.key is not None for h in headers for r in decode_batch(buf, h))
