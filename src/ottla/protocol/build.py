"""Build kio entities for whatever version was negotiated, from one set of values.

Handlers describe a response once, with every field any version has; `make` keeps the
fields the version's class declares. That keeps one handler per API instead of one per
(API, version), which is how Kafka's own JSON schemas are meant to be used.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(name for name in cls.__dataclass_fields__ if not name.startswith("__"))


def make(cls: type, **values: Any) -> Any:
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


def has_field(cls: type, name: str) -> bool:
    return name in _field_names(cls)


@cache
def nested(entity_type: type, name: str) -> type | None:
    """The nested class called `name` in the same schema version as `entity_type`, if it has one
    (a class Ottla extended names its changed nested classes in `__nested__`: protocol/extensions.py)."""
    changed = getattr(entity_type, "__nested__", None)
    if changed and name in changed:
        return changed[name]
    return getattr(sys.modules[entity_type.__module__], name, None)
