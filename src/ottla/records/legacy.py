"""Message format v0/v1 (magic 0 and 1): what Produce v0-2 carries and Fetch v0-3 expects.

Kafka 3.9 still served these old clients by converting (KIP-896 removed them in 4.0): the
log only ever holds v2 batches, so a v0/v1 message set is up-converted to one v2 batch on
produce and v2 batches are down-converted to uncompressed v0/v1 messages on fetch, as
Kafka's broker did. Only these slow paths decode records; current clients never pay.

Fetch v0-3 responses are converted lazily (`LazyDownConversion`, Kafka's
LazyDownConversionRecords, KIP-283): the handler only walks the records' key and value
lengths to know the converted size, and the connection converts a group of batches at a
time as the socket drains, so a consumer that does not read holds one group, not its whole
response converted (or, for a batch sent by groups of its records, that batch's records,
decompressed once for all its groups). The walk's reads, like the connection's, leave pages
not in the page cache to a thread (`FileRecords.read_off_loop`). Unlike Kafka, which declares max(source size, first converted batch)
and pads or cuts the converted stream to fit, the size declared is exact: the bytes sent are
those `down_convert` makes of the whole response.

Message layout: offset i64 | size i32 | crc u32 (CRC-32 of magic..end) | magic i8 |
attributes i8 (bits 0-2 codec, bit 3 LogAppendTime in v1) | [timestamp i64, v1 only] |
key bytes | value bytes. A compressed message's value is a compressed inner message set.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Awaitable, Callable, Generator, Iterator

from ..errors import ErrorCode, KafkaError
from .batch import HEADER_SIZE, read_header
from .compression import NONE, decompress, decompress_bounded
from .records import Record, build_batch, decode_bytes, decode_varint, iter_batches
from .validator import key_value_sizes

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


# What one unread Fetch v0-3 response holds converted: a group of whole batches is closed
# once its messages, or the batches it converts, reach this size, and a batch converting to
# more is sent as groups of its records.
GROUP_BYTES = 256 * 1024
# Converted responses shorter than this are converted at once, by the handler.
EAGER_BYTES = 64 * 1024
# The walk that sizes a response reads its batches this much at a time.
_WALK_READ_BYTES = 1 << 20


def _reader(source) -> Callable[[int, int], Awaitable]:
    """An async read(start, length) of a `FileRecords` (its `read_off_loop`: cold pages are
    read in a thread, not on the event loop) or of bytes in memory."""
    if hasattr(source, "read_off_loop"):
        return source.read_off_loop
    read = source.read if hasattr(source, "read") else lambda start, length: source[start:start + length]

    async def read_now(start: int, length: int):
        return read(start, length)
    return read_now


def _message_overhead(magic: int) -> int:
    """A converted message's bytes besides its key and value (see `_message`)."""
    return _PREFIX.size + 8 + (_I64.size if magic == 1 else 0)


def _records_of(data, header) -> bytes:
    with memoryview(data) as view:
        return decompress(header.compression, view[header.position + HEADER_SIZE:header.position + header.size])


def _corrupt(header, exc: Exception) -> KafkaError:
    return KafkaError(ErrorCode.corrupt_message, f"malformed record in batch at offset {header.base_offset}: {exc}")


def _varint(records, position: int) -> tuple[int, int]:
    """`decode_varint`, with the one-byte varints of small records decoded inline (a call
    costs more than the rest of the walk of a record)."""
    b = records[position]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), position + 1
    return decode_varint(records, position)


def _message_sizes(records, header, overhead: int, each: list[int] | None = None) -> int:
    """The converted size of a batch's `records` (decompressed), from their key and value
    lengths (nothing built); with `each`, every record's message size is appended to it."""
    fast = key_value_sizes(records, header.records_count)
    if fast is not None:
        sizes = fast[0] + fast[1] + overhead
        if each is not None:
            each.extend(sizes.tolist())
        return int(sizes.sum())
    end = len(records)
    total = position = 0
    try:
        for _ in range(header.records_count):
            b = records[position]
            length, position = ((b >> 1) ^ -(b & 1), position + 1) if b < 0x80 else decode_varint(records, position)
            record_end = position + length
            if length < 0 or record_end > end:
                raise ValueError("record runs past the batch")
            p = position + 1  # the attributes
            p = p + 1 if records[p] < 0x80 else decode_varint(records, p)[1]  # timestamp delta
            p = p + 1 if records[p] < 0x80 else decode_varint(records, p)[1]  # offset delta
            key, p = _varint(records, p)
            value, p = _varint(records, p + max(key, 0))
            if p + max(value, 0) > record_end:
                raise ValueError("field runs past the record")
            size = overhead + max(key, 0) + max(value, 0)
            total += size
            if each is not None:
                each.append(size)
            position = record_end
        if position != end:
            raise ValueError("bytes left after the declared record count")
    except (IndexError, ValueError) as exc:
        raise _corrupt(header, exc) from None
    return total


def _convert_records(header, records, magic: int, position: int, take: int) -> tuple[bytes, int]:
    """The `take` records of a batch (its `records` decompressed) from byte `position` on,
    as `down_convert` makes them, and the position after them."""
    log_append_time = header.timestamp_type == 1
    out = bytearray()
    try:
        for _ in range(take):
            length, position = decode_varint(records, position)
            record_end = position + length
            timestamp_delta, p = decode_varint(records, position + 1)
            offset_delta, p = decode_varint(records, p)
            key, p = decode_bytes(records, p)
            value, p = decode_bytes(records, p)
            timestamp = header.max_timestamp if log_append_time else header.first_timestamp + timestamp_delta
            out += _message(header.base_offset + offset_delta, magic, timestamp, header.timestamp_type, key, value)
            position = record_end
    except (IndexError, ValueError) as exc:
        raise _corrupt(header, exc) from None
    return bytes(out), position


class LazyDownConversion:
    """Fetched v2 batches (in memory or a `FileRecords`) sent as v0/v1 messages, converted a
    group at a time as the socket drains. `groups`: (source start, end, first record, record
    count or -1 for whole batches, converted size). Its length is the exact converted size,
    so the encoder writes it like any records."""

    __slots__ = ("source", "magic", "groups", "size", "_batch")

    def __init__(self, source, magic: int):
        self.source = source
        self.magic = magic
        self.groups: list[tuple[int, int, int, int, int]] = []
        self.size = 0
        # The batch being sent by groups of its records, decompressed once for all of them:
        # (its start in the source, header, records, next record, its byte position).
        self._batch: tuple | None = None

    def walk(self) -> Generator[tuple[int, int], bytes, None]:
        """Size the groups. The source is read a piece (`_WALK_READ_BYTES`, or one larger
        batch) at a time by the caller: the walk yields (start, length) and is sent the bytes
        (`walked` reads them off the event loop when cold and gives the loop a turn)."""
        overhead = _message_overhead(self.magic)
        total = len(self.source)
        group_start = position = group_size = 0
        while total - position >= HEADER_SIZE:
            data = None  # not held while others run: a walk holds one piece only while it runs
            data = yield position, min(_WALK_READ_BYTES, total - position)
            offset = 0
            while len(data) - offset >= HEADER_SIZE:
                header = read_header(data, offset)
                if header.size < HEADER_SIZE or position + offset + header.size > total:
                    break  # a torn tail: dropped, as the client would drop it
                if offset + header.size > len(data):
                    if offset == 0:  # a batch larger than one read
                        data = None
                        data = yield position, header.size
                        continue
                    break
                start, offset = position + offset, offset + header.size
                records = None if header.is_control else _records_of(data, header)
                size = 0 if records is None else _message_sizes(records, header, overhead)
                if size > GROUP_BYTES:  # sent as groups of its records
                    if start > group_start:
                        self._add(group_start, start, 0, -1, group_size)
                    sizes: list[int] = []
                    _message_sizes(records, header, overhead, sizes)
                    self._split(start, position + offset, sizes)
                    group_start, group_size = position + offset, 0
                    continue
                group_size += size
                if group_size >= GROUP_BYTES or position + offset - group_start >= GROUP_BYTES:
                    self._add(group_start, position + offset, 0, -1, group_size)
                    group_start, group_size = position + offset, 0
            if offset == 0:
                break
            position += offset
        if position > group_start:
            self._add(group_start, position, 0, -1, group_size)

    def _split(self, start: int, end: int, sizes: list[int]) -> None:
        first = size = 0
        for index, message in enumerate(sizes):
            size += message
            if size >= GROUP_BYTES or index == len(sizes) - 1:
                self._add(start, end, first, index + 1 - first, size)
                first, size = index + 1, 0

    def _add(self, start: int, end: int, skip: int, take: int, size: int) -> None:
        self.groups.append((start, end, skip, take, size))
        self.size += size

    def __len__(self) -> int:
        return self.size

    def needs_read(self, group: tuple[int, int, int, int, int]) -> bool:
        """Whether `convert` needs the group's bytes from the source: not for the next group
        of the batch whose records it keeps."""
        return self._batch is None or self._batch[0] != group[0] or self._batch[3] != group[2]

    def convert(self, data, group: tuple[int, int, int, int, int]) -> bytes:
        """A group's messages from its batches (`data`, read from the source, None when
        `needs_read` says no); ValueError if they do not come to the size walked: the source
        changed, and the frame cannot be completed.

        A batch sent by groups of its records is decompressed for its first group and kept
        until its last (Kafka converts and holds the whole batch), not decompressed again
        for each: one inflating to 32 MiB was decompressed 128 times."""
        start, _, skip, take, size = group
        if take < 0:
            converted = down_convert(data, self.magic)
        else:
            if self.needs_read(group):
                self._batch = None  # the one before goes before this one comes
                if skip:
                    raise ValueError("a batch's groups are converted in order, from its first")
                header = read_header(data, 0)
                self._batch = (start, header, _records_of(data, header), 0, 0)
            _, header, records, _, position = self._batch
            converted, position = _convert_records(header, records, self.magic, position, take)
            done = skip + take >= header.records_count
            self._batch = None if done else (start, header, records, skip + take, position)
        if len(converted) != size:
            raise ValueError(f"{len(converted)} bytes converted where {size} were declared")
        return converted


async def walked(source, magic: int, turn: Callable[[], Awaitable[None]]) -> LazyDownConversion:
    """`source`'s conversion, sized: `turn` gives the event loop a turn before each piece the
    walk reads, and a piece not in the page cache is read in a thread (`_reader`)."""
    lazy = LazyDownConversion(source, magic)
    read = _reader(source)
    walk = lazy.walk()
    try:
        request = next(walk)
        while True:
            await turn()
            request = walk.send(await read(*request))
    except StopIteration:
        return lazy


async def down_converted(source, magic: int, turn: Callable[[], Awaitable[None]]) -> "bytes | LazyDownConversion":
    """What a Fetch v0-3 response carries for `source`: converted at once when short, else
    lazily (see `walked`)."""
    lazy = await walked(source, magic, turn)
    if len(lazy) >= EAGER_BYTES:
        return lazy
    read = _reader(source)
    return b"".join([lazy.convert(await read(group[0], group[1] - group[0]), group) for group in lazy.groups])
