"""The group coordinator's deadlines: one heap, keyed by what each deadline guards."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Hashable


@dataclass(slots=True)
class DelayedJoin:
    """The pending end of a PreparingRebalance.

    `initial` is Kafka's InitialDelayedJoin for a group leaving Empty: it never completes
    early, and each expiry that saw new members waits another delay, within `remaining_ms`.
    """

    initial: bool
    delay_ms: int = 0
    remaining_ms: int = 0


class Timers:
    """Deadlines keyed by what they guard; scheduling a key again replaces its deadline."""

    def __init__(self, on_schedule: Callable[[int], None] | None = None) -> None:
        self._on_schedule = on_schedule
        self._heap: list[tuple[int, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, int, Any]] = {}
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int, payload: Any = None) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline_ms, seq, payload)
        heapq.heappush(self._heap, (deadline_ms, seq, key))
        if self._on_schedule is not None:
            self._on_schedule(deadline_ms)

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def payload(self, key: Hashable) -> Any:
        entry = self._live.get(key)
        return None if entry is None else entry[2]

    def next_deadline(self) -> int | None:
        """The earliest live deadline (stale heap entries of rescheduled keys are dropped)."""
        while self._heap:
            deadline, seq, key = self._heap[0]
            entry = self._live.get(key)
            if entry is not None and entry[1] == seq:
                return deadline
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now_ms: int) -> tuple[Hashable, Any] | None:
        while self._heap and self._heap[0][0] <= now_ms:
            _, seq, key = heapq.heappop(self._heap)
            entry = self._live.get(key)
            if entry is not None and entry[1] == seq:
                del self._live[key]
                return key, entry[2]
        return None
