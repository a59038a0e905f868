"""One thread for the log layer's slow disk work, so it does not stall every client.

The broker's event loop serves all connections; an fsync there (tens of milliseconds on a
disk busy with writeback) or the removal of a deleted topic's files holds every produce and
fetch behind it. Like Kafka's scheduler threads, this worker takes the fsync of a rolled
segment and its producer snapshot, the offset checkpoints and the removal of deleted
partitions' directories. One thread, jobs in order: a checkpoint submitted after a roll's
fsync is written after it.

What a job changes in the log's state (the recovery point) is applied on the owner's
thread, by `complete`, never by the worker. A failed fsync goes through ottla.durability
in the worker like anywhere else (by default the process halts).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Callable

__all__ = ["DiskWorker"]

log = logging.getLogger(__name__)


class DiskWorker:
    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ottla-disk")
        self._finished: SimpleQueue[tuple[Callable[[bool], None], bool]] = SimpleQueue()

    def submit(self, what: str, job: Callable[[], object], then: Callable[[bool], None] | None = None) -> Future:
        """Run `job` in the worker; `then(succeeded)` runs at the next `complete`. The returned
        future is done once the job ran (never wait on it from the worker's own jobs)."""
        future = self._executor.submit(job)

        def done(finished: Future) -> None:
            error = finished.exception()
            if error is not None:
                log.error("%s failed: %s: %s", what, type(error).__name__, error)
            if then is not None:
                self._finished.put((then, error is None))
        future.add_done_callback(done)
        return future

    def complete(self) -> None:
        """Apply the results of the jobs done so far (on the owner's thread: the event loop)."""
        while True:
            try:
                then, succeeded = self._finished.get_nowait()
            except Empty:
                return
            then(succeeded)

    def drain(self) -> None:
        """Wait for every job submitted so far, then apply their results."""
        self._executor.submit(lambda: None).result()
        self.complete()

    def close(self) -> None:
        self.drain()
        self._executor.shutdown()
