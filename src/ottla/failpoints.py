"""Crash points for process-level tests: `OTTLA_FAILPOINTS` (comma-separated names), read once
when the broker starts so an unset variable costs nothing on any hot path."""

from __future__ import annotations

import os

__all__ = ["from_environment"]


def from_environment() -> frozenset[str]:
    return frozenset(name.strip() for name in os.environ.get("OTTLA_FAILPOINTS", "").split(",") if name.strip())
