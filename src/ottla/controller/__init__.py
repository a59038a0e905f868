"""The cluster controller: pure state machines over a `ClusterStore` (see controller.py)."""

from .context import ControllerConfig, PartitionPhase, ReplicaPhase
from .controller import Controller
from .requests import ControllerRequest

__all__ = ["Controller", "ControllerConfig", "ControllerRequest", "PartitionPhase", "ReplicaPhase"]
