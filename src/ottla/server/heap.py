"""The broker's memory: keep the buffers produce requests reuse and give back what a storm
of connections left behind (glibc's heap; no-ops where libc is not glibc), and keep
long-lived connections out of the garbage collector's full walks."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connections import Connections

log = logging.getLogger("ottla.broker")

# Open connections more than at the last `freeze_long_lived` before it runs again.
FREEZE_STEP = 500
# Connections closed since the heap was last trimmed before it is trimmed again: each leaves
# freed objects scattered over the heap (about 17 KiB a connection, measured), which glibc
# does not give back on its own once the heap is fragmented.
RELEASE_AFTER_CLOSED = 1000


def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


_libc = _glibc()


def keep_freed_request_buffers() -> None:
    """Every produce request brings a buffer of up to a few MB that lives for one request.

    glibc serves allocations that large with a fresh mmap and unmaps them on free, so each
    request paid for faulting in and zeroing its pages again: measured, half the broker's CPU
    on 1 KiB-record produce. Raising glibc's mmap and trim thresholds (its documented
    `mallopt` knobs) lets freed buffers be reused from the heap.
    """
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum
    mallopt(m_trim_threshold, 128 << 20)


def freeze_long_lived() -> None:
    """`gc.freeze()`: what is alive now leaves the collector's generations, so full collections
    no longer walk it; reference counting still frees it (a closed connection, a finished
    request: neither leaves cyclic garbage, `tests/unit/test_network.py`).

    A full collection walks every tracked object, and its cost is the connections': 5,000
    of them made one take 40-51 ms of the loop's CPU (102-230 ms wall) in the accept storm
    that brought them (docs/performance.md). `Connections` calls this each time the open
    connections have grown by `FREEZE_STEP` since the last time, so a collection walks at most
    about that many connections' objects, however many are open. Only cyclic garbage made
    from frozen objects would stay, and the broker makes practically none (a producer and a
    consumer group's whole session: none after import time)."""
    gc.freeze()


def release_free_heap() -> None:
    """glibc's `malloc_trim(0)`: give the kernel every free page of the heap, also those between
    live allocations (which the trim threshold alone never returns)."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


async def release_after_connection_storms(connections: "Connections") -> None:
    """A broker duty: once `RELEASE_AFTER_CLOSED` connections have closed and the closing has
    calmed down (fewer than a tenth of that in the last second), trim the heap in a thread
    (ctypes lets go of the GIL).

    A closed connection is freed by reference counting alone (`network._drop_transport_cycle`),
    so nothing waits for a garbage collection first; the duty used to run a full collection
    here for the asyncio transports that were cyclic garbage, and that collection held the loop
    for 255-448 ms after a storm of 5,000 (docs/performance.md)."""
    pending = 0
    while True:
        await asyncio.sleep(1.0)
        closed, connections.closed_since_release = connections.closed_since_release, 0
        pending += closed
        if pending >= RELEASE_AFTER_CLOSED and closed < RELEASE_AFTER_CLOSED // 10:
            started = time.perf_counter()
            await asyncio.to_thread(release_free_heap)
            log.debug("after %d connections closed: heap trimmed in %.0f ms", pending,
                      (time.perf_counter() - started) * 1000)
            pending = 0
