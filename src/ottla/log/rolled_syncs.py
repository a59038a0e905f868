"""The segments a roll sealed whose fsync waits in the disk worker, as Kafka's roll schedules its
flush: fsynced at once when a flush or close cannot wait, and their descriptors duplicated for
an fdatasync off the event loop (`Log.duplicate_data_fds`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..durability import fsync
from .disk_worker import DiskWorker

__all__ = ["RolledSyncs"]

Unsynced = list[tuple[int, Path]]  # a sealed segment's open descriptors, with their paths


class RolledSyncs:
    """One log's rolled segments whose fsync is still queued."""

    def __init__(self) -> None:
        self._queued: list[Unsynced] = []

    def submit(self, worker: DiskWorker, what: str, unsynced: Unsynced, *, first: Callable[[], None],
               last: Callable[[], None], synced: Callable[[], None]) -> None:
        """In `worker`: `first()`, the fsyncs, then `last()` (a FileNotFoundError from it: the
        partition was deleted meanwhile, nothing to keep); then on the caller's side the
        descriptors are closed, and `synced()` runs if all of it succeeded."""
        self._queued.append(unsynced)

        def job() -> None:
            first()
            for fd, path in unsynced:
                fsync(fd, path)
            try:
                last()
            except FileNotFoundError:
                pass

        def then(succeeded: bool) -> None:
            self._queued.remove(unsynced)
            for fd, _ in unsynced:
                os.close(fd)
            if succeeded:
                synced()
        worker.submit(what, job, then)

    def sync_now(self) -> None:
        """fsync now what the worker has still to do (it does it again, harmlessly)."""
        for unsynced in self._queued:
            for fd, path in unsynced:
                fsync(fd, path)

    def duplicate_fds(self) -> list[int]:
        """Duplicates of the queued segments' descriptors; the caller closes them."""
        return [os.dup(fd) for unsynced in self._queued for fd, _ in unsynced]
