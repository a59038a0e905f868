"""The cluster controller: pure state machines over a `ClusterStore` (see controller.py).

Its names are loaded on first use (PEP 562): a single node imports only `admin` (topic
assignment) from here, and importing the state machines was a share of every broker start."""

from __future__ import annotations

import importlib

__all__ = ["Controller", "ControllerConfig", "ControllerRequest", "PartitionPhase", "ReplicaPhase"]

_MODULE_OF = {"Controller": "controller", "ControllerConfig": "context", "ControllerRequest": "requests",
              "PartitionPhase": "context", "ReplicaPhase": "context"}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
