"""A simulated power loss for in-process tests: what was not fsynced is gone.

`PowerLoss(data_dir)` records the size of every file under `data_dir` when it is installed,
and, from then on, the size of a file each time `os.fsync`/`os.fdatasync` is called on it
(any thread, any descriptor: the broker syncs duplicates in worker threads). `crash()` then
cuts every file back to the size it had at its last fsync -- or at install time, or to
nothing for a file created since and never synced -- the way a machine that lost power
keeps only what reached the disk.

The model fits the broker's files: segment `.log`s and `.txnindex`es grow by appends and
shrink only by `os.ftruncate` (recovery, a follower's truncation), after which nothing past
the cut counts as synced until the next fsync: bytes appended over a truncated range were
never on disk. Every file rewritten in place is written to a temporary file, fsynced and
renamed. Offset and time indexes are memory-mapped
and never trusted past the recovery point, so they are left alone; directory entries are
taken as durable.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_UNSYNCED_KINDS = (".index", ".timeindex")


class PowerLoss:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._lock = threading.Lock()
        self._synced: dict[tuple[int, int], int] = {}  # (device, inode) -> size at last fsync
        for path in self._files():
            st = path.stat()
            self._synced[(st.st_dev, st.st_ino)] = st.st_size
        self._real = (os.fsync, os.fdatasync)
        self._real_ftruncate = os.ftruncate
        self.syncs = 0

    def _files(self):
        return [p for p in self.data_dir.rglob("*") if p.is_file() and not p.name.endswith(_UNSYNCED_KINDS)]

    def _recording(self, real):
        def sync(fd):
            real(fd)
            st = os.fstat(fd)
            with self._lock:
                self._synced[(st.st_dev, st.st_ino)] = st.st_size
                self.syncs += 1
        return sync

    def _truncating(self, real):
        def ftruncate(fd, length):
            real(fd, length)
            st = os.fstat(fd)
            with self._lock:
                key = (st.st_dev, st.st_ino)
                if key in self._synced:
                    self._synced[key] = min(self._synced[key], length)
        return ftruncate

    def __enter__(self) -> "PowerLoss":
        os.fsync, os.fdatasync = (self._recording(real) for real in self._real)
        os.ftruncate = self._truncating(self._real_ftruncate)
        return self

    def __exit__(self, *exc) -> None:
        os.fsync, os.fdatasync = self._real
        os.ftruncate = self._real_ftruncate

    def crash(self) -> dict[str, int]:
        """Cut every file back to what was synced; returns the bytes lost per file."""
        lost = {}
        with self._lock:
            for path in self._files():
                st = path.stat()
                keep = min(self._synced.get((st.st_dev, st.st_ino), 0), st.st_size)
                if keep < st.st_size:
                    os.truncate(path, keep)
                    lost[str(path.relative_to(self.data_dir))] = st.st_size - keep
        return lost
