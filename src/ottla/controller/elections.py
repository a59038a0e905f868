"""Kafka's four leader election strategies (`PartitionLeaderElectionAlgorithms`).

Each takes the assignment order, the ISR and the brokers that may lead, and returns the new
leader and ISR, or None when no replica may lead (the partition stays or goes offline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Strategy", "OFFLINE", "REASSIGN", "PREFERRED", "CONTROLLED_SHUTDOWN", "elect"]


@dataclass(frozen=True)
class Strategy:
    name: str
    # Offline election only: None follows `unclean.leader.election.enable` (topic, then
    # broker); True is ElectLeaders(UNCLEAN).
    allow_unclean: bool | None = None


OFFLINE = Strategy("offline")
REASSIGN = Strategy("reassign")
PREFERRED = Strategy("preferred")
CONTROLLED_SHUTDOWN = Strategy("controlled_shutdown")


def offline(assignment: Sequence[int], isr: Sequence[int], live: set[int],
            unclean: bool) -> tuple[int, tuple[int, ...]] | None:
    """First live replica in assignment order that is in the ISR; with unclean election
    allowed, else the first live replica (its log may lack acknowledged records)."""
    for replica in assignment:
        if replica in live and replica in isr:
            return replica, tuple(r for r in isr if r in live)
    if unclean:
        for replica in assignment:
            if replica in live:
                return replica, (replica,)
    return None


def reassign(target: Sequence[int], isr: Sequence[int], live: set[int]) -> tuple[int, tuple[int, ...]] | None:
    for replica in target:
        if replica in live and replica in isr:
            return replica, tuple(isr)
    return None


def preferred(assignment: Sequence[int], isr: Sequence[int], live: set[int]) -> tuple[int, tuple[int, ...]] | None:
    if assignment and assignment[0] in live and assignment[0] in isr:
        return assignment[0], tuple(isr)
    return None


def controlled_shutdown(assignment: Sequence[int], isr: Sequence[int], live: set[int],
                        shutting_down: set[int]) -> tuple[int, tuple[int, ...]] | None:
    """Leadership moves to an ISR member that is not shutting down, and the shutting-down
    brokers leave the ISR."""
    for replica in assignment:
        if replica in live and replica in isr and replica not in shutting_down:
            return replica, tuple(r for r in isr if r not in shutting_down)
    return None


def elect(strategy: Strategy, assignment: Sequence[int], isr: Sequence[int], live: set[int],
          shutting_down: set[int], unclean: bool, target: Sequence[int] = ()) -> tuple[int, tuple[int, ...]] | None:
    if strategy.name == "offline":
        return offline(assignment, isr, live - shutting_down, unclean)
    if strategy.name == "reassign":
        return reassign(target, isr, live - shutting_down)
    if strategy.name == "preferred":
        return preferred(assignment, isr, live - shutting_down)
    return controlled_shutdown(assignment, isr, live, shutting_down)
