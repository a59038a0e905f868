"""Message format v0/v1 (magic 0 and 1): what Produce v0-2 carries and Fetch v0-3 expects.

Kafka 3.9 still served these old clients by converting (KIP-896 removed them in 4.0): the
log only ever holds v2 batches, so a v0/v1 message set is up-converted to one v2 batch on
produce and v2 batches are down-converted to uncompressed v0/v1 messages on fetch, as
Kafka's broker did. Only these slow paths decode records; current clients never pay.

Message layout: offset i64 | size i32 | crc u32 (CRC-32 of magic..end) | magic i8 |
attributes i8 (bits 0-2 codec, bit 3 LogAppendTime in v1) | [timestamp i64, v1 only] |
key bytes | value bytes. A compressed message's value is a compressed inner message set.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

from ..errors import ErrorCode, KafkaError
from .compression import NONE, decompress_bounded
from .records import Record, build_batch, iter_batches

_PREFIX = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08


def _read_bytes(data, position: int) -> tuple[bytes | None, int]:
    (length,) = _I32.unpack_from(data, position)
    position += 4
    if length < 0:
        return None, position
    if position + length > len(data):
        raise ValueError("field runs past the message")
    return bytes(data[position:position + length]), position + length


def _messages(data, inflate_limit: int, depth: int = 0) -> Iterator[tuple[int, int, int, bytes | None, bytes | None]]:
    """(magic, attributes, timestamp, key, value) of every message, compressed ones unwrapped
    (each wrapper's value inflating to at most `inflate_limit` bytes)."""
    position = 0
    while position < len(data):
        if len(data) - position < _PREFIX.size:
            raise ValueError(f"truncated message at byte {position}")
        _, size, crc, magic, attributes = _PREFIX.unpack_from(data, position)
        end = position + 12 + size
        if magic not in (0, 1) or size < 14 or end > len(data):
            raise ValueError(f"malformed message of {size} bytes, magic {magic}, at byte {position}")
        if zlib.crc32(data[position + 16:end]) != crc:
            raise ValueError(f"message at byte {position} fails its CRC")
        cursor = position + _PREFIX.size
        timestamp = -1
        if magic == 1:
            (timestamp,) = _I64.unpack_from(data, cursor)
            cursor += 8
        key, cursor = _read_bytes(data, cursor)
        value, cursor = _read_bytes(data, cursor)
        codec = attributes & _CODEC_MASK
        if codec == NONE:
            yield magic, attributes, timestamp, key, value
        elif depth == 0 and value is not None:
            inner = decompress_bounded(codec, value, inflate_limit)
            for item in _messages(inner, inflate_limit, depth + 1):
                # Inner v1 messages of a LogAppendTime wrapper take the wrapper's timestamp.
                if attributes & _LOG_APPEND_TIME:
                    item = (item[0], item[1] | _LOG_APPEND_TIME, timestamp, item[3], item[4])
                yield item
        else:
            raise ValueError("nested compressed message")
        position = end


def _wrapper_codec(data) -> int:
    return data[_PREFIX.size - 1] & _CODEC_MASK if len(data) >= _PREFIX.size else NONE


def converts_inline(data, inline: int) -> bool:
    """Whether up-converting `data` is little work: uncompressed, at most `inline` bytes (every
    message becomes a record object; a wrapper may inflate to 32 x max.message.bytes)."""
    return _wrapper_codec(data) == NONE and len(data) <= inline


def up_convert(data, now_ms: int, inflate_limit: int) -> bytes:
    """One v2 batch holding the records of a v0/v1 message set (Produce v0-2).

    The producer's codec is kept. Magic 0 messages have no timestamp; they get `now_ms`,
    which is what the v2 batch's CreateTime would have been had the client set none.
    A malformed or CRC-failing set is CORRUPT_MESSAGE, an empty one INVALID_RECORD; a wrapper
    inflating past `inflate_limit` (the v2 batch's bound) is MESSAGE_TOO_LARGE.
    """
    try:
        messages = list(_messages(memoryview(data).toreadonly(), inflate_limit))
    except (ValueError, struct.error) as exc:
        raise KafkaError(ErrorCode.corrupt_message, f"invalid message set: {exc}") from None
    if not messages:
        raise KafkaError(ErrorCode.invalid_record, "message set is empty")
    records = [Record(key, value, (), timestamp if timestamp >= 0 else now_ms)
               for _, _, timestamp, key, value in messages]
    log_append_time = 1 if messages[0][1] & _LOG_APPEND_TIME else 0
    return build_batch(records, compression=_wrapper_codec(data), timestamp_type=log_append_time, now_ms=now_ms)


def _message(offset: int, magic: int, timestamp: int, timestamp_type: int, key, value) -> bytes:
    body = bytearray(struct.pack(">bb", magic, _LOG_APPEND_TIME if magic and timestamp_type else 0))
    if magic == 1:
        body += _I64.pack(timestamp)
    for field in (key, value):
        body += _I32.pack(-1) if field is None else _I32.pack(len(field)) + field
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + bytes(body)


def down_convert(data, magic: int) -> bytes:
    """Fetched v2 batches as uncompressed magic 0/1 messages (Fetch v0-1 and v2-3).

    Control batches (transaction markers) have no v0/v1 form and are left out, as Kafka
    does; a torn batch at the end of the read is dropped like the client would drop it.
    """
    out = bytearray()
    for header, records in iter_batches(data):
        if header.is_control:
            continue
        for record in records:
            out += _message(record.offset, magic, record.timestamp, header.timestamp_type, record.key, record.value)
    return bytes(out)
