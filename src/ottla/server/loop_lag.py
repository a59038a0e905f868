"""How long the event loop was held, and by which request.

Every request, timer and reply runs on one event loop, so a callback that runs for 400 ms
freezes every client for 400 ms. Two measures:

- `LoopLag`, told by the loop's selector (`server/event_loop.py`) when it wakes and when it
  polls again: the time between the two is one iteration of the loop, the longest any timer or
  socket can wait for it (wall clock: on a busy machine it also counts time spent waiting for a
  CPU), and the loop thread's CPU since a reading taken at most 10 ms before the iteration began
  (one hold plus at most 10 ms of other work; the CPU clock is a system call, read at most every
  10 ms while the loop iterates and only once after it slept). It wakes nothing: a probe task
  sleeping 10 ms at a time cost 20 ms of CPU per second on a 2-CPU VM (each wake-up about
  200 us, mostly the kernel's), as much as a Spark source leg's Fetch answers
  (docs/performance.md). Each new worst over 100 ms is logged at INFO (and each new worst
  CPU figure from 20 ms), a freeze of a second or more as a WARNING, and both worst figures at
  shutdown (INFO).
- `timed`, which runs one request's coroutine and measures each synchronous step of it (from
  one await to the next: decoding, the handler's code, encoding) with the loop thread's CPU
  clock, so a long hold is attributed to an API and version whatever the machine's load (the
  wall clock of a step also counts waiting for a CPU: on a loaded machine ApiVersions v0
  "took" 186 ms), less the garbage collections that ran inside the step (an ApiVersions v0
  "took" 85 ms of CPU: a full collection's). A step of 100 ms of CPU or more is logged at INFO with its request; the
  longest step per API is logged at shutdown (`steps_summary`). Cost: two reads of the thread
  CPU clock per step (a system call each, 0.3-1.5 us).
- `GcPauses`, a `gc.callbacks` hook: the longest garbage collection per generation, which
  lands in whatever step allocates at that moment, and how many ran (logged at shutdown).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Coroutine

log = logging.getLogger("ottla.loop")

_NOTE_MS = 100.0
_NOTE_CPU_MS = 20.0
_WARN_MS = 1000.0

# The longest single step seen per "ApiName vN" (ms of the loop thread's CPU), for the shutdown summary.
longest_steps: dict[str, float] = {}
# CPU seconds the loop's thread has spent in garbage collections (`GcPauses`): a step's own
# work is its CPU less the collections that ran inside it.
_loop_gc_cpu = [0.0]


# The loop thread's CPU clock is read again once this much wall time has passed since the last reading.
_CPU_READ_S = 0.01


class LoopLag:
    """The longest iteration of the event loop, from the selector's two calls (`woke`, `polling`)."""

    def __init__(self):
        self.worst_ms = 0.0
        self.worst_cpu_ms = 0.0
        self.measuring = False  # from `start`: the broker's own start-up is not a hold
        self._woke = self._read_at = time.perf_counter()
        self._cpu = time.thread_time()

    def start(self) -> None:
        """Measure from the end of the current iteration on."""
        self.measuring = True
        self._woke = self._read_at = time.perf_counter()
        self._cpu = time.thread_time()

    def woke(self) -> None:
        """The selector returned: an iteration begins."""
        now = self._woke = time.perf_counter()
        if now - self._read_at >= _CPU_READ_S:
            self._read_at, self._cpu = now, time.thread_time()

    def polling(self) -> None:
        """The selector is about to poll: the iteration that began at `woke` is over."""
        if not self.measuring:
            return
        held_ms = (time.perf_counter() - self._woke) * 1000
        if held_ms < _CPU_READ_S * 1000:  # its CPU is less still: below every threshold
            self.worst_ms = max(self.worst_ms, held_ms)
            return
        cpu_ms = (time.thread_time() - self._cpu) * 1000
        if held_ms >= _WARN_MS:
            log.warning("event loop held for %.0f ms (%.0f ms of CPU)", held_ms, cpu_ms)
        if held_ms > self.worst_ms:
            if held_ms >= _NOTE_MS:
                log.info("event loop lag %.0f ms (%.0f ms of CPU), the worst so far", held_ms, cpu_ms)
            self.worst_ms = held_ms
        if cpu_ms > self.worst_cpu_ms:
            if cpu_ms >= _NOTE_CPU_MS:  # timestamped, so a benchmark can tell which phase held it
                log.info("event loop: %.0f ms of CPU between two wake-ups (%.0f ms late), the worst so far",
                         cpu_ms, held_ms)
            self.worst_cpu_ms = cpu_ms


class _Timed:
    """Drives a coroutine as its awaiter would, timing each `send`/`throw` (one step). It holds
    no bound methods or closures: a long poll keeps one alive for its whole wait, and a full
    garbage collection walks every such object (docs/performance.md)."""

    __slots__ = ("coro", "owner", "longest")

    def __init__(self, coro: Coroutine, owner: Any):
        self.coro, self.owner, self.longest = coro, owner, 0.0

    def __await__(self):
        coro = self.coro
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                started, collected = time.thread_time(), _loop_gc_cpu[0]
                try:
                    yielded = coro.send(value) if error is None else coro.throw(error)
                except StopIteration as done:
                    return done.value
                finally:
                    own = time.thread_time() - started - (_loop_gc_cpu[0] - collected)
                    self.longest = max(self.longest, own)
                    # Forgotten before it propagates: an exception thrown in and raised back
                    # (a closed connection's cancellation) carries this frame in its traceback,
                    # and the frame holding it would make the whole request cyclic garbage.
                    value, error = None, None
                try:
                    value = yield yielded
                except BaseException as exc:  # cancellation included: the coroutine handles it
                    error = exc
        finally:
            self._note()

    def _note(self) -> None:
        held_ms = self.longest * 1000
        what = self.owner.what
        if held_ms > longest_steps.get(what, 0.0):
            longest_steps[what] = held_ms
        if held_ms >= _NOTE_MS:
            log.info("%s held the event loop for %.0f ms of CPU in one step", what, held_ms)


def timed(coro: Coroutine, owner: Any) -> _Timed:
    """Await `coro`, attributing its longest synchronous step to `owner.what` ("ApiName vN",
    read at the end: the request is named once decoded)."""
    return _Timed(coro, owner)


class GcPauses:
    """The longest garbage collection (ms of wall clock, per generation): a full collection
    runs inside whichever step allocates at that moment and holds the loop like any other
    work. Collections on the loop's thread (the one that creates this) also add their CPU to
    `_loop_gc_cpu`, so that `timed` leaves them out of the request they interrupted."""

    def __init__(self):
        self.worst_ms = [0.0, 0.0, 0.0]
        self.worst_cpu_ms = [0.0, 0.0, 0.0]  # on the loop's thread: its own CPU, whatever the machine's load
        self.count = [0, 0, 0]
        self.total_ms = [0.0, 0.0, 0.0]
        self._thread = threading.get_ident()
        self._started = self._cpu_started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        on_loop = threading.get_ident() == self._thread
        if phase == "start":
            self._started = time.perf_counter()
            if on_loop:
                self._cpu_started = time.thread_time()
            return
        generation = info["generation"]
        took_ms = (time.perf_counter() - self._started) * 1000
        self.worst_ms[generation] = max(self.worst_ms[generation], took_ms)
        self.count[generation] += 1
        self.total_ms[generation] += took_ms
        if on_loop:
            cpu = time.thread_time() - self._cpu_started
            _loop_gc_cpu[0] += cpu
            self.worst_cpu_ms[generation] = max(self.worst_cpu_ms[generation], cpu * 1000)

    def summary(self) -> str:
        """Per generation the longest (wall clock, and the loop thread's CPU), how many ran and their total (wall)."""
        return ", ".join(f"generation {g} {self.worst_ms[g]:.0f} ms ({self.worst_cpu_ms[g]:.0f} ms of CPU; "
                         f"{self.count[g]} in {self.total_ms[g]:.0f} ms)" for g in range(3))


def steps_summary(top: int = 8) -> str:
    worst = sorted(longest_steps.items(), key=lambda item: -item[1])[:top]
    return ", ".join(f"{what} {ms:.0f} ms" for what, ms in worst) or "none"
