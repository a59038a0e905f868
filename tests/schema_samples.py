"""Builds a valid, non-trivial instance of any kio-style schema class (kio's or ours).

Every field gets a value of its wire type that differs from the default, so a round trip
that drops or misplaces a field shows up as an inequality.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import fields
from types import NoneType, UnionType
from typing import get_args, get_origin

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta, i64Timedelta

_VALUES = {
    "int8": 3, "int16": 7, "int32": 1234, "int64": 1 << 40, "uint16": 9, "uint32": 11,
    "uint64": 13, "float64": 2.5, "bool": True, "string": "sample", "bytes": b"\x00\x01bytes",
    "uuid": uuid.UUID(int=0x1234), "error_code": ErrorCode.unknown_topic_or_partition,
}


def _unwrap(hint):
    if get_origin(hint) is UnionType:
        args = [arg for arg in get_args(hint) if arg is not NoneType]
        return args[0]
    return hint


def _primitive(kafka_type: str, hint):
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(milliseconds=1500))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(milliseconds=1 << 33))
    if kafka_type == "datetime_i64":
        return datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone.utc)
    if kafka_type == "records":
        return b"opaque record batch bytes"
    value = _VALUES[kafka_type]
    hint = _unwrap(hint)
    return hint(value) if isinstance(hint, type) and kafka_type not in ("uuid", "error_code", "bool") else value


def sample(schema: type):
    """An instance of `schema` with every field set."""
    values = {}
    for field in fields(schema):
        hint = _unwrap(field.type)
        if get_origin(hint) is tuple:
            inner = _unwrap(get_args(hint)[0])
            if "kafka_type" in field.metadata:
                values[field.name] = (_primitive(field.metadata["kafka_type"], inner),) * 2
            else:
                values[field.name] = (sample(inner), sample(inner))
        elif "kafka_type" in field.metadata:
            values[field.name] = _primitive(field.metadata["kafka_type"], hint)
        else:
            values[field.name] = sample(hint)
    return schema(**values)
