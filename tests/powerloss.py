"""A simulated power loss for in-process tests: what was not fsynced is gone.

`PowerLoss(data_dir)` records the size of every file under `data_dir` when it is installed,
and, from then on, the size of a file each time `os.fsync`/`os.fdatasync` is called on it
(any thread, any descriptor: the broker syncs duplicates in worker threads). `crash()` then
cuts every file back to the size it had at its last fsync -- or at install time, or to
nothing for a file created since and never synced -- the way a machine that lost power
keeps only what reached the disk.

`images_at_every_sync(into, note)` also makes, at every fsync, the copy a crash at that moment
would leave (`into/0001`, ...), with `note()` called then (what had been acknowledged by then),
so a test can restart from each of them: a power loss at every point of a run.

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
from typing import Callable

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
        self._images: tuple[Path, Callable[[], object]] | None = None
        self.images: list[tuple[Path, object]] = []

    def _files(self):
        return [p for p in self.data_dir.rglob("*") if p.is_file() and not p.name.endswith(_UNSYNCED_KINDS)]

    def _recording(self, real):
        def sync(fd):
            real(fd)
            st = os.fstat(fd)
            with self._lock:
                self._synced[(st.st_dev, st.st_ino)] = st.st_size
                self.syncs += 1
                if self._images is not None:
                    self._image()
        return sync

    def images_at_every_sync(self, into: Path, note: Callable[[], object]) -> None:
        self._images = (Path(into), note)

    def _image(self) -> None:
        into, note = self._images
        noted = note()  # before the copy: anything acknowledged by now was synced before now
        image = into / f"{len(self.images) + 1:04d}"
        for path in self.data_dir.rglob("*"):
            try:
                if not path.is_file():
                    continue
                st = path.stat()
                keep = st.st_size if path.name.endswith(_UNSYNCED_KINDS) else min(
                    self._synced.get((st.st_dev, st.st_ino), 0), st.st_size)
                target = image / path.relative_to(self.data_dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "rb") as source, open(target, "wb") as copy:
                    copy.write(source.read(keep))
            except FileNotFoundError:  # removed meanwhile (a deleted snapshot, a renamed temp file)
                continue
        self.images.append((image, noted))

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
