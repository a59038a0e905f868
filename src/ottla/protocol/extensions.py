"""Ottla's own tagged fields (KIP-482) on Kafka messages, for what no Kafka API carries.

DescribeLogDirs v2+ (the flexible versions): a request whose tag `DIRTY_RATIO_TAG` (10000,
far above the tags Kafka numbers from 0) is true asks for the dirty ratio of each compacted
partition; the answer's partitions then carry it under the same tag as a float64, absent for
partitions that are not compacted. Kafka exposes the ratio only as a JMX metric
(`max-dirty-percent`); `ottla topics describe` shows it. Only a request that carries the tag
gets it: kio's reader, and so any client built on kio, refuses a tag it does not know instead
of skipping it as Kafka's readers do.

The classes are kio's, subclassed with the tagged field, so kio's readers and writers
serialize them and `protocol/shape.py` walks the request's tag like any other.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from functools import cache

from kio.index import load_request_schema, load_response_schema
from kio.static.primitive import f64

from .build import nested

__all__ = ["DIRTY_RATIO_TAG", "DESCRIBE_LOG_DIRS", "extended_request", "extended_response"]

DIRTY_RATIO_TAG = 10000
DESCRIBE_LOG_DIRS = 35
_FIRST_FLEXIBLE = 2
_FLAGS = {"frozen": True, "slots": True, "kw_only": True}


def _extends(api_key: int, version: int) -> bool:
    return api_key == DESCRIBE_LOG_DIRS and version >= _FIRST_FLEXIBLE


def _subclass(base: type, fields: list, changed: dict[str, type] | None = None) -> type:
    """`base` with `fields` added or retyped. It keeps kio's module, where `build.nested` finds
    the nested classes left unchanged; the changed ones are in `__nested__`."""
    namespace = {"__nested__": changed} if changed else None
    cls = make_dataclass(base.__name__, fields, bases=(base,), namespace=namespace, **_FLAGS)
    cls.__module__ = base.__module__  # make_dataclass's `module` argument is Python 3.12's
    return cls


@cache
def extended_request(api_key: int, version: int) -> type | None:
    """DescribeLogDirsRequest with `dirty_ratio` (tag 10000, bool): the asker wants the ratios."""
    if not _extends(api_key, version):
        return None
    tag = field(metadata={"kafka_type": "bool", "tag": DIRTY_RATIO_TAG}, default=False)
    return _subclass(load_request_schema(api_key, version), [("dirty_ratio", bool, tag)])


@cache
def extended_response(api_key: int, version: int) -> type | None:
    """DescribeLogDirsResponse whose partitions have `dirty_ratio` (tag 10000, float64, None
    when absent)."""
    if not _extends(api_key, version):
        return None
    base = load_response_schema(api_key, version)
    tag = field(metadata={"kafka_type": "float64", "tag": DIRTY_RATIO_TAG}, default=None)
    partition = _subclass(nested(base, "DescribeLogDirsPartition"), [("dirty_ratio", f64 | None, tag)])
    topic = _subclass(nested(base, "DescribeLogDirsTopic"), [("partitions", tuple[partition, ...])])
    result = _subclass(nested(base, "DescribeLogDirsResult"), [("topics", tuple[topic, ...])])
    changed = {"DescribeLogDirsPartition": partition, "DescribeLogDirsTopic": topic, "DescribeLogDirsResult": result}
    return _subclass(base, [("results", tuple[result, ...])], changed)
