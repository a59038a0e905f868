"""How long the event loop was held: a task that measures how late it wakes up.

Every request, timer and reply runs on one event loop, so a callback that runs for 400 ms
freezes every client for 400 ms. The probe sleeps `interval_s` at a time and records how
much later than asked it woke: the worst lag goes to the log at shutdown (INFO), each new
worst over 100 ms is logged at INFO, and a freeze of a second or more is a WARNING.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("ottla.loop")

_NOTE_MS = 100.0
_WARN_MS = 1000.0


class LoopLag:
    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.worst_ms = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(self.interval_s)
            lag_ms = (loop.time() - started - self.interval_s) * 1000
            if lag_ms >= _WARN_MS:
                log.warning("event loop held for %.0f ms", lag_ms)
            if lag_ms > self.worst_ms:
                if lag_ms >= _NOTE_MS:
                    log.info("event loop lag %.0f ms, the worst so far", lag_ms)
                self.worst_ms = lag_ms
