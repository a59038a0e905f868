"""Structure-aware request fuzzing: valid requests of every API and version, then mutations.

`valid_request(api_key, version, rng)` builds a request from kio's schema classes with small
values (names from `names`, so some requests touch real topics and groups); `mutate`
damages its bytes the way a hostile or broken client would (lying lengths and counts,
varints, truncation, bit flips, unknown keys and versions, tagged-field garbage).
`benchmarks/fuzz.py` and `tests/integration/test_fuzz.py` drive a real broker with them.
"""

from __future__ import annotations

import dataclasses
import io
import random
import struct
import types
import typing
import uuid
from datetime import timedelta

from kio.index import load_request_schema
from kio.serial import entity_writer

_SIZE = struct.Struct(">i")


def _is_nullable(annotation) -> bool:
    return (typing.get_origin(annotation) in (types.UnionType, typing.Union)
            and types.NoneType in typing.get_args(annotation))


def _strip_none(annotation):
    if _is_nullable(annotation):
        return next(arg for arg in typing.get_args(annotation) if arg is not types.NoneType)
    return annotation


class RequestFactory:
    """Builds small valid requests; `names` are the strings used for every string field."""

    def __init__(self, rng: random.Random, names: tuple[str, ...] = ("fuzz",), records: tuple[bytes, ...] = ()):
        self.rng = rng
        self.names = names
        self.records = records

    def request(self, api_key: int, version: int):
        return self._entity(load_request_schema(api_key, version))

    def _entity(self, entity_type):
        values = {}
        for field in dataclasses.fields(entity_type):
            if field.metadata.get("tag") is not None and self.rng.random() < 0.5:
                continue  # leave the tagged field at its default
            values[field.name] = self._value(field.type, field.metadata.get("kafka_type"))
        return entity_type(**values)

    def _value(self, annotation, kafka_type):
        rng = self.rng
        if _is_nullable(annotation) and rng.random() < 0.15:
            return None
        inner = _strip_none(annotation)
        if typing.get_origin(inner) is tuple:
            element = typing.get_args(inner)[0]
            return tuple(self._value(element, kafka_type) for _ in range(rng.choice((0, 1, 1, 2))))
        if dataclasses.is_dataclass(inner):
            return self._entity(inner)
        return self._primitive(inner, kafka_type)

    def _primitive(self, python_type, kafka_type):
        rng = self.rng
        if kafka_type == "string":
            return rng.choice(self.names)
        if kafka_type == "records":
            return rng.choice(self.records) if self.records else b""
        if kafka_type == "bytes":
            return bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
        if kafka_type == "uuid":
            return uuid.UUID(int=rng.getrandbits(128) | 1) if rng.random() < 0.3 else None  # kio: zero is None
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            return timedelta(milliseconds=rng.choice((0, 1, 100)))
        if kafka_type == "float64":
            return 0.0
        if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "uint8", "uint32", "uint64"):
            low = 0 if kafka_type.startswith("u") else -1
            return python_type(rng.choice((low, 0, 0, 1, 2, 3)))
        raise TypeError(f"no value for kafka_type {kafka_type!r} ({python_type})")


def encode(request, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    """A size-prefixed frame."""
    header_type = type(request).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(request_api_key=request.__api_key__,
                                                request_api_version=request.__version__,
                                                correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(request))(out, request)
    payload = out.getvalue()
    return _SIZE.pack(len(payload)) + payload


_LIES = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000)


def mutate(frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One damaged copy of a valid frame and the name of what was done to it."""
    data = bytearray(frame)
    body_start = 12  # size, api key, version, correlation id
    kind = rng.choice(("flip", "lie32", "lie16", "varint", "truncate", "extend", "version", "api_key",
                       "tagged", "splice", "size", "zero"))
    if len(data) <= body_start:
        kind = "extend"
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(4, len(data))
            data[position] ^= 1 << rng.randrange(8)
    elif kind == "lie32" and len(data) >= body_start + 4:
        position = rng.randrange(body_start, len(data) - 3)
        data[position:position + 4] = struct.pack(">I", rng.choice(_LIES) & 0xFFFFFFFF)
    elif kind == "lie16" and len(data) >= body_start + 2:
        position = rng.randrange(body_start, len(data) - 1)
        data[position:position + 2] = struct.pack(">H", rng.choice(_LIES) & 0xFFFF)
    elif kind == "varint":
        position = rng.randrange(body_start, len(data))
        data[position:position + 1] = rng.choice((b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\x00",
                                                  b"\x80\x80\x80\x80\x80\x01", b"\xff\xff\x03", b"\x01"))
    elif kind == "truncate":
        del data[rng.randrange(body_start, len(data)):]
    elif kind == "extend":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "version":
        data[6:8] = struct.pack(">h", rng.choice((-1, 99, 32767, rng.randrange(20))))
    elif kind == "api_key":
        data[4:6] = struct.pack(">h", rng.choice((-1, 999, 32767, rng.randrange(100))))
    elif kind == "tagged":
        # Replace the last byte (often the empty tagged-field section) with garbage tags.
        data[-1:] = bytes((rng.randint(1, 3), rng.randrange(128), rng.randrange(128))) + \
            bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    elif kind == "splice":
        start = rng.randrange(body_start, len(data))
        data[start:start] = data[body_start:rng.randrange(body_start, len(data)) + 1]
    elif kind == "zero":
        start = rng.randrange(body_start, len(data))
        data[start:start + rng.randint(1, 8)] = bytes(min(8, len(data) - start))
    if kind != "size":
        _SIZE.pack_into(data, 0, len(data) - 4)
    else:
        _SIZE.pack_into(data, 0, max(0, len(data) - 4 - rng.randint(1, 4)))
    return kind, bytes(data)
