"""Check a request's lengths and counts against the bytes it carries, before kio reads it.

kio 0.6.5's native reader reserves room for an array from the count on the wire before it
reads a single element (`Vec::with_capacity(count)`): a 20-byte request claiming 2^32-2
elements makes it ask for 32 GiB, and Rust aborts the whole process when that fails
(docs/kio-array-count.md). So every frame is walked here first, following exactly the
structure kio will read (the request schema's dataclass fields and their `kafka_type`),
and refused when an array count could not fit in the bytes left (each element takes at
least a known number of bytes), when a string or bytes length runs past the end, or when
a non-nullable array is null (kio would hand the handler None). Nothing is allocated and
no values are built: it costs a few microseconds per request whatever its size.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import threading
import types
import typing
from functools import cache
from typing import Callable

from kio.serial.writers import write_unsigned_varint

from .errors import MalformedRequest
from .schemas import request_schema

Buffer = bytes | memoryview
# A compiled field: walks one value starting at `pos`, returns the position after it.
Walker = Callable[[Buffer, int, int], int]

_FIXED_SIZES = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT8 = struct.Struct(">b")


class _Shape:
    """How to walk one value, and the fewest bytes it can take (for bounding counts)."""

    __slots__ = ("walk", "min_size", "fixed")

    def __init__(self, walk: Walker, min_size: int, fixed: bool = False):
        self.walk = walk
        self.min_size = min_size
        self.fixed = fixed


def _uvarint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint as kio reads it: at most five bytes."""
    if pos < end and buf[pos] < 0x80:  # one byte: nearly every length and tag count
        return buf[pos], pos + 1
    value = shift = 0
    for _ in range(5):
        if pos >= end:
            raise MalformedRequest("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MalformedRequest("varint longer than five bytes")


def _fixed(size: int, name: str) -> _Shape:
    def walk(buf, pos, end):
        pos += size
        if pos > end:
            raise MalformedRequest(f"{name}: truncated")
        return pos
    return _Shape(walk, size, fixed=True)


def _legacy_sized(header: struct.Struct, nullable: bool, name: str) -> _Shape:
    """STRING / NULLABLE_STRING (int16 length) and BYTES / NULLABLE_BYTES (int32 length)."""
    width = header.size
    unpack = header.unpack_from

    def walk(buf, pos, end):
        if pos + width > end:
            raise MalformedRequest(f"{name}: truncated length")
        (length,) = unpack(buf, pos)
        pos += width
        if length < 0:
            if length == -1 and nullable:
                return pos
            raise MalformedRequest(f"{name}: {'null' if length == -1 else 'negative length'} "
                                   f"where a value is required")
        if length > end - pos:
            raise MalformedRequest(f"{name}: length {length} exceeds the {end - pos} bytes left")
        return pos + length
    return _Shape(walk, width)


def _compact_sized(nullable: bool, name: str) -> _Shape:
    """COMPACT_STRING / COMPACT_BYTES and their nullable forms (varint length + 1)."""
    def walk(buf, pos, end):
        length, pos = _uvarint(buf, pos, end)
        if length == 0:
            if nullable:
                return pos
            raise MalformedRequest(f"{name}: null where a value is required")
        if length - 1 > end - pos:
            raise MalformedRequest(f"{name}: length {length - 1} exceeds the {end - pos} bytes left")
        return pos + length - 1
    return _Shape(walk, 1)


def _array(element: _Shape, compact: bool, nullable: bool, name: str) -> _Shape:
    element_walk = element.walk
    # Every element takes at least one byte, so a count is bounded by the bytes left
    # (Kafka's own readers bound it the same way).
    min_size = max(element.min_size, 1)
    fixed_step = element.min_size if element.fixed else 0

    def walk(buf, pos, end):
        if compact:
            count, pos = _uvarint(buf, pos, end)
            count -= 1
        else:
            if pos + 4 > end:
                raise MalformedRequest(f"{name}: truncated count")
            (count,) = _INT32.unpack_from(buf, pos)
            pos += 4
        if count < 0:
            if count == -1 and nullable:
                return pos
            raise MalformedRequest(f"{name}: {'null' if count == -1 else 'negative count'} "
                                   f"where an array is required")
        if count * min_size > end - pos:
            raise MalformedRequest(f"{name}: count {count} cannot fit in the {end - pos} bytes left")
        if fixed_step:
            return pos + count * fixed_step
        for _ in range(count):
            pos = element_walk(buf, pos, end)
        return pos
    return _Shape(walk, 1 if compact else 4)


def _nullable_entity(inner: _Shape, name: str) -> _Shape:
    inner_walk = inner.walk

    def walk(buf, pos, end):
        if pos >= end:
            raise MalformedRequest(f"{name}: truncated")
        (marker,) = _INT8.unpack_from(buf, pos)
        if marker == -1:
            return pos + 1
        return inner_walk(buf, pos + 1, end)
    return _Shape(walk, 1)


def _is_nullable(annotation) -> bool:
    return (typing.get_origin(annotation) in (types.UnionType, typing.Union)
            and types.NoneType in typing.get_args(annotation))


def _strip_none(annotation):
    if _is_nullable(annotation):
        (inner,) = [arg for arg in typing.get_args(annotation) if arg is not types.NoneType]
        return inner
    return annotation


def _primitive(kafka_type: str, flexible: bool, nullable: bool, name: str) -> _Shape:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _fixed(size, name)
    if kafka_type not in ("string", "bytes", "records"):
        raise TypeError(f"{name}: no shape for kafka_type {kafka_type!r}")
    if flexible:
        return _compact_sized(nullable, name)
    return _legacy_sized(_INT16 if kafka_type == "string" else _INT32, nullable, name)


def _field_shape(entity: type, field: dataclasses.Field, tagged: bool) -> _Shape:
    """Mirrors kio's `build_field_schema`: which reader kio picks for this field."""
    flexible = entity.__flexible__
    name = f"{entity.__name__}.{field.name}"
    if entity.__name__ == "RequestHeader" and field.name == "client_id":
        return _legacy_sized(_INT16, True, name)  # always NULLABLE_STRING, even in header v2
    nullable = _is_nullable(field.type)
    inner = _strip_none(field.type)
    if typing.get_origin(inner) is tuple:
        element_type = typing.get_args(inner)[0]
        if dataclasses.is_dataclass(element_type):
            element = _entity_shape(element_type)
        else:
            element = _primitive(field.metadata["kafka_type"], flexible, False, name)
        return _array(element, flexible, nullable, name)
    if dataclasses.is_dataclass(inner):
        shape = _entity_shape(inner)
        return _nullable_entity(shape, name) if nullable else shape
    # kio reads a tagged primitive with the non-nullable reader.
    return _primitive(field.metadata["kafka_type"], flexible, nullable and not tagged, name)


@cache
def _entity_shape(entity: type) -> _Shape:
    regular: list[Walker] = []
    tagged: dict[int, Walker] = {}
    min_size = 0
    for field in dataclasses.fields(entity):
        tag = field.metadata.get("tag")
        shape = _field_shape(entity, field, tag is not None)
        if tag is None:
            regular.append(shape.walk)
            min_size += shape.min_size
        else:
            tagged[int(tag)] = shape.walk
    flexible = entity.__flexible__
    name = entity.__name__

    def walk(buf, pos, end):
        for walk_field in regular:
            pos = walk_field(buf, pos, end)
        if flexible:
            if pos < end and buf[pos] == 0:  # no tagged fields, the common case
                return pos + 1
            count_at = pos
            count, pos = _uvarint(buf, pos, end)
            if count * 2 > end - pos:
                raise MalformedRequest(f"{name}: {count} tagged fields cannot fit in the {end - pos} bytes left")
            edits = _stripping.edits
            kept: list[tuple[int, int]] = []
            for _ in range(count):
                field_at = pos
                tag, pos = _uvarint(buf, pos, end)
                size, pos = _uvarint(buf, pos, end)
                if size > end - pos:
                    raise MalformedRequest(f"{name}: tagged field {tag} of {size} bytes exceeds the {end - pos} left")
                walk_tagged = tagged.get(tag)
                if walk_tagged is None:
                    if edits is None:
                        raise UnknownTaggedFields(f"{name}: unknown tagged field {tag}")
                    pos += size
                    continue
                inner_edits = len(edits) if edits is not None else 0
                pos = walk_tagged(buf, pos, end)
                if edits is not None and len(edits) != inner_edits:
                    raise MalformedRequest(f"{name}: unknown tagged fields inside tagged field {tag}")
                kept.append((field_at, pos))
            if edits is not None and len(kept) < count:
                edits.append((count_at, pos, uvarint_bytes(len(kept)) + b"".join(bytes(buf[a:b]) for a, b in kept)))
        return pos
    return _Shape(walk, min_size + (1 if flexible else 0))


@cache
def _request_walkers(api_key: int, api_version: int) -> tuple[Walker, Walker]:
    schema = request_schema(api_key, api_version)
    return _entity_shape(schema.__header_schema__).walk, _entity_shape(schema).walk


def check_request(frame: Buffer, api_key: int, api_version: int) -> int:
    """Raise MalformedRequest unless kio can read `frame` without trusting a count it cannot
    check; returns where the body ends (trailing bytes are allowed, as Kafka allows them).
    Raises UnknownTaggedFields if the frame carries tags its version does not define."""
    walk_header, walk_body = _request_walkers(api_key, api_version)
    end = len(frame)
    try:
        return walk_body(frame, walk_header(frame, 0, end), end)
    except struct.error as exc:  # an int read past the end: truncated
        raise MalformedRequest(f"truncated: {exc}") from None


class UnknownTaggedFields(Exception):
    """A flexible request carries tagged fields its version does not define: Kafka skips them
    (KIP-482: a newer client may add tags to a version an older broker serves), kio 0.6 refuses
    them (KeyError), so `strip_unknown_tagged_fields` removes them before kio reads the frame."""


class _Stripping(threading.local):
    edits: list[tuple[int, int, bytes]] | None = None  # (start, end, replacement) while stripping


_stripping = _Stripping()


def strip_unknown_tagged_fields(frame: Buffer, api_key: int, api_version: int) -> bytes:
    """`frame` without the tagged fields its version does not define (each tag block rewritten
    with its count and the known fields only); raises MalformedRequest as `check_request`."""
    _stripping.edits = edits = []
    try:
        check_request(frame, api_key, api_version)
    finally:
        _stripping.edits = None
    out = bytearray()
    done = 0
    for start, stop, replacement in sorted(edits):
        out += frame[done:start]
        out += replacement
        done = stop
    out += frame[done:]
    return bytes(out)


def uvarint_bytes(value: int) -> bytes:
    out = io.BytesIO()
    write_unsigned_varint(out, value)
    return out.getvalue()


def produce_entries(frame: Buffer, api_version: int, limit: int) -> int:
    """How many topic and partition entries a Produce frame names, counted no further than
    `limit` (`limit` too when the frame does not walk): a walk of a few steps that tells a
    Produce of a few large batches (decoded on the event loop) from one naming thousands of
    partitions (hundreds of ms of walking and parsing, decoded in a worker thread)."""
    flexible = api_version >= 9
    end = len(frame)
    try:
        (client_id,) = _INT16.unpack_from(frame, 8)
        pos = 10 + max(client_id, 0)
        if flexible:
            pos = _skip_tagged(frame, pos, end)
        if api_version >= 3:  # transactional_id
            pos = _skip_string(frame, pos, end, flexible)
        pos += 6  # acks, timeout
        topics, pos = _count(frame, pos, end, flexible)
        entries = topics
        for _ in range(topics):
            if entries >= limit:
                return limit
            pos = pos + 16 if api_version >= 13 else _skip_string(frame, pos, end, flexible)
            partitions, pos = _count(frame, pos, end, flexible)
            entries += partitions
            for _ in range(partitions if entries < limit else 0):
                pos += 4  # index
                if flexible:
                    length, pos = _uvarint(frame, pos, end)
                    pos = _skip_tagged(frame, pos + max(length - 1, 0), end)
                else:
                    (length,) = _INT32.unpack_from(frame, pos)
                    pos += 4 + max(length, 0)
            if flexible:
                pos = _skip_tagged(frame, pos, end)
        return min(entries, limit)
    except (MalformedRequest, struct.error):
        return limit


def _count(buf: Buffer, pos: int, end: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        count, pos = _uvarint(buf, pos, end)
        return max(count - 1, 0), pos
    (count,) = _INT32.unpack_from(buf, pos)
    return max(count, 0), pos + 4


def _skip_string(buf: Buffer, pos: int, end: int, flexible: bool) -> int:
    if flexible:
        length, pos = _uvarint(buf, pos, end)
        return pos + max(length - 1, 0)
    (length,) = _INT16.unpack_from(buf, pos)
    return pos + 2 + max(length, 0)


def _skip_tagged(buf: Buffer, pos: int, end: int) -> int:
    fields, pos = _uvarint(buf, pos, end)
    if fields > 64:  # not a few steps: let the worker thread's full walk judge them
        raise MalformedRequest("many tagged fields")
    for _ in range(fields):
        _, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        pos += size
    return pos
