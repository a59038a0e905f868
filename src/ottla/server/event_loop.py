"""The broker's event loop: asyncio's selector loop, handed at most `READY_SLICE` ready
sockets per iteration.

asyncio asks epoll for every ready descriptor at once and runs all their callbacks in the
same iteration. When thousands of clients go away together (a disconnect storm: a client
host restarting, a proxy dropping its connections), one wake-up returned all 5,000
end-of-file reads and the next two iterations ran their 5,000 `connection_lost` and
cancelled request loops: 58-81 ms of CPU each on an idle machine (docs/performance.md).
Asking the kernel for at most `READY_SLICE` keeps every iteration bounded; what is left stays
ready (epoll is level-triggered) and comes with the next iteration, which does not sleep.
epoll hands back ready descriptors round-robin (a returned one goes to the back of its
ready list), so a few busy connections cannot starve the others. It also tells the loop's hold
probe (`loop_lag.LoopLag`) when each iteration begins and ends, so the probe needs no wake-ups.
"""

from __future__ import annotations

import asyncio
import math
import select
import selectors

READY_SLICE = 256


if hasattr(selectors, "EpollSelector"):

    class SlicedEpollSelector(selectors.EpollSelector):
        """`EpollSelector` whose `select` returns at most `ready_slice` ready descriptors."""

        def __init__(self, ready_slice: int = READY_SLICE, probe=None):
            super().__init__()
            self.ready_slice = ready_slice
            self.probe = probe  # `loop_lag.LoopLag`, or None

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None:
                timeout = -1
            elif timeout <= 0:
                timeout = 0
            else:
                timeout = math.ceil(timeout * 1e3) * 1e-3  # epoll counts ms: wait at least `timeout`
            probe = self.probe
            if probe is not None:
                probe.polling()
            try:
                polled = self._selector.poll(timeout, self.ready_slice)
            except InterruptedError:
                polled = ()
            if probe is not None:
                probe.woke()
            ready = []
            for fd, mask in polled:
                key = self._key_from_fd(fd)
                if key is None:
                    continue
                # As selectors does: errors and hang-ups wake both the reader and the writer.
                events = (selectors.EVENT_WRITE if mask & ~select.EPOLLIN else 0) | \
                         (selectors.EVENT_READ if mask & ~select.EPOLLOUT else 0)
                ready.append((key, events & key.events))
            return ready


def new_event_loop(ready_slice: int = READY_SLICE, probe=None) -> asyncio.AbstractEventLoop:
    """The loop `ottla serve` runs on, its iterations timed by `probe` (a `loop_lag.LoopLag`);
    asyncio's default where there is no epoll (and no probe)."""
    if not hasattr(selectors, "EpollSelector"):
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(SlicedEpollSelector(ready_slice, probe))
