"""A lean walk over a record set for loading the internal topics: offset, key and value only.

The coordinators replay their whole `__consumer_offsets` / `__transaction_state` partition
at every load. `iter_batches` builds a `BatchHeader` per batch and a `Record` (timestamp,
headers) per record, which made a load after a commit storm take seconds. This reads only
what a replay needs, with the same bounds checks as `decode_batch` (a malformed record is
CORRUPT_MESSAGE, never an IndexError), and inflates compressed batches the same way.
"""

from __future__ import annotations

import struct
from typing import Iterator

from ..errors import ErrorCode, KafkaError
from .batch import COMPRESSION_MASK, CONTROL_BIT, HEADER, HEADER_SIZE, LOG_OVERHEAD, TRANSACTIONAL_BIT
from .compression import NONE, decompress
from .records import decode_varint

# What the plain path reads of a header: base offset, length, attributes, record count.
_PLAIN_FIELDS = struct.Struct(">qi9xh34xi")  # 61 bytes: the whole header
_NOT_PLAIN = COMPRESSION_MASK | TRANSACTIONAL_BIT | CONTROL_BIT

# (offset, key, value) of one record.
ScannedRecord = tuple[int, "bytes | None", "bytes | None"]
# (base offset, last offset, attributes, producer id, records) of one batch.
ScannedBatch = tuple[int, int, int, int, list[ScannedRecord]]


def scan_batches(buf: bytes, plain_into: "dict[bytes, tuple[int, bytes | None]] | None" = None
                 ) -> Iterator[ScannedBatch]:
    """Every whole batch of `buf` (a torn tail is ignored, as `iter_batches` does).

    With `plain_into`, the keyed records of plain batches (uncompressed, no transaction, not
    control: each of a commit storm's commits) are not yielded but stored there by key, a later
    record replacing an earlier one, as (offset, value): the hot loop of a coordinator load."""
    position = 0
    end = len(buf)
    unpack = HEADER.unpack_from
    while end - position >= HEADER_SIZE:
        if plain_into is not None:
            position = _store_plain_batches(buf, position, plain_into)
            if end - position < HEADER_SIZE:
                return
        (base_offset, batch_length, _, _, _, attributes, last_delta, _, _, producer_id, _, _,
         count) = unpack(buf, position)
        size = batch_length + LOG_OVERHEAD
        if size < HEADER_SIZE or position + size > end:
            return
        try:
            if attributes & COMPRESSION_MASK == NONE:
                records = _records(buf, position + HEADER_SIZE, position + size, base_offset, count)
            else:
                data = decompress(attributes & COMPRESSION_MASK, memoryview(buf)[position + HEADER_SIZE:position + size])
                records = _records(bytes(data), 0, len(data), base_offset, count)
        except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise _malformed(base_offset, exc) from None
        yield base_offset, base_offset + last_delta, attributes, producer_id, records
        position += size


def _malformed(base_offset: int, exc: Exception) -> KafkaError:
    return KafkaError(ErrorCode.corrupt_message, f"malformed record in batch at offset {base_offset}: {exc}")


def _store_plain_batches(data: bytes, position: int, into: "dict[bytes, tuple[int, bytes | None]]") -> int:
    """Store the keyed records of the plain batches from `position` on in `into` (a record
    without a key is dropped, as a replay drops it); returns the position of the first batch
    that is not plain, or of a torn tail. The same walk and checks as `_records`, with no list
    or tuple per batch: one-byte varints are read inline, and a record without headers (the
    usual case) is read straight off the buffer."""
    end = len(data)
    unpack = _PLAIN_FIELDS.unpack_from
    base_offset = -1
    try:
        while end - position >= HEADER_SIZE:
            base_offset, batch_length, attributes, count = unpack(data, position)
            batch_end = position + batch_length + LOG_OVERHEAD
            if batch_end - position < HEADER_SIZE or batch_end > end or attributes & _NOT_PLAIN:
                return position
            position += HEADER_SIZE
            for _ in range(count):
                byte = data[position]
                if byte < 0x80:
                    length, position = (byte >> 1) ^ -(byte & 1), position + 1
                else:
                    length, position = decode_varint(data, position)
                record_end = position + length
                if length < 0 or record_end > batch_end:
                    raise ValueError("record runs past the batch")
                if data[position + 1] < 0x80 and data[position + 2] < 0x80:  # timestamp and offset deltas
                    byte = data[position + 2]
                    offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 3
                else:
                    _, position = decode_varint(data, position + 1)
                    offset_delta, position = decode_varint(data, position)
                byte = data[position]
                if byte < 0x80:
                    length, position = (byte >> 1) ^ -(byte & 1), position + 1
                else:
                    length, position = decode_varint(data, position)
                if length < 0:
                    key = None
                else:
                    if position + length > record_end:
                        raise ValueError("key runs past the record")
                    key = data[position:position + length]
                    position += length
                byte = data[position]
                if byte < 0x80:
                    length, position = (byte >> 1) ^ -(byte & 1), position + 1
                else:
                    length, position = decode_varint(data, position)
                if length < 0:
                    value = None
                elif position + length > record_end:
                    raise ValueError("value runs past the record")
                else:
                    value = data[position:position + length]
                    position += length
                if data[position] != 0:
                    _skip_headers(data, position, record_end)
                elif position + 1 != record_end:
                    raise ValueError("record length does not match its fields")
                position = record_end
                if key is not None:
                    into[key] = (base_offset + offset_delta, value)
            if position != batch_end:
                raise ValueError("bytes left after the declared record count")
    except (IndexError, ValueError) as exc:
        raise _malformed(base_offset, exc) from None
    return position


def _records(data: bytes, position: int, end: int, base_offset: int, count: int) -> list[ScannedRecord]:
    """The records between `position` and `end`; one-byte varints (the usual case) are read inline."""
    records = []
    for _ in range(count):
        byte = data[position]
        if byte < 0x80:
            length, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            length, position = decode_varint(data, position)
        record_end = position + length
        if length < 0 or record_end > end:
            raise ValueError("record runs past the batch")
        position += 1  # attributes
        byte = data[position]
        if byte < 0x80:  # timestamp delta, not needed
            position += 1
        else:
            _, position = decode_varint(data, position)
        byte = data[position]
        if byte < 0x80:
            offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            offset_delta, position = decode_varint(data, position)
        byte = data[position]
        if byte < 0x80:
            length, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            length, position = decode_varint(data, position)
        if length < 0:
            key = None
        else:
            if position + length > record_end:
                raise ValueError("key runs past the record")
            key = data[position:position + length]
            position += length
        byte = data[position]
        if byte < 0x80:
            length, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            length, position = decode_varint(data, position)
        if length < 0:
            value = None
        else:
            if position + length > record_end:
                raise ValueError("value runs past the record")
            value = data[position:position + length]
            position += length
        # Headers: a replay ignores them; skipped within the record's declared length.
        if data[position] != 0:
            _skip_headers(data, position, record_end)
        elif position + 1 != record_end:
            raise ValueError("record length does not match its fields")
        position = record_end
        records.append((base_offset + offset_delta, key, value))
    if position != end:
        raise ValueError("bytes left after the declared record count")
    return records


def _skip_headers(data: bytes, position: int, record_end: int) -> None:
    """Walk the headers (count, then key and value lengths) so a malformed one is still refused."""
    count, position = decode_varint(data, position)
    for _ in range(count):
        length, position = decode_varint(data, position)
        if length < 0:
            raise ValueError("null header key")
        bytes(data[position:position + length]).decode()  # refused as decode_batch refuses it
        position += length
        length, position = decode_varint(data, position)
        position += max(length, 0)
    if position != record_end or count < 0:
        raise ValueError("record length does not match its fields")
