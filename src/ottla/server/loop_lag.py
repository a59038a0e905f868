"""How long the event loop was held: a task that measures how late it wakes up.

Every request, timer and reply runs on one event loop, so a callback that runs for 400 ms
freezes every client for 400 ms. The probe sleeps `interval_s` at a time and records how
much later than asked it woke (wall clock), and how much CPU the loop's thread used in that
time: on a busy machine the wall-clock lag also counts time spent waiting for a CPU, the
CPU figure only the loop's own work. Each new worst over 100 ms is logged at INFO, a
freeze of a second or more as a WARNING, and both worst figures at shutdown (INFO).
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("ottla.loop")

_NOTE_MS = 100.0
_WARN_MS = 1000.0


class LoopLag:
    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.worst_ms = 0.0
        self.worst_cpu_ms = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started, cpu_started = loop.time(), time.thread_time()
            await asyncio.sleep(self.interval_s)
            lag_ms = (loop.time() - started - self.interval_s) * 1000
            cpu_ms = (time.thread_time() - cpu_started) * 1000
            if lag_ms >= _WARN_MS:
                log.warning("event loop held for %.0f ms (%.0f ms of CPU)", lag_ms, cpu_ms)
            if lag_ms > self.worst_ms:
                if lag_ms >= _NOTE_MS:
                    log.info("event loop lag %.0f ms (%.0f ms of CPU), the worst so far", lag_ms, cpu_ms)
                self.worst_ms = lag_ms
            self.worst_cpu_ms = max(self.worst_cpu_ms, cpu_ms)
