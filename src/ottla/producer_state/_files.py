"""Crash-safe file replacement: a reader sees the old content or the new, never a mix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..durability import fsync

TEMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """Persist a directory's entries, so a rename survives power loss, not just a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd, directory)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> Callable[[], None] | None:
    """Write `data` to a temp file, fsync it, rename it over `path`, fsync the directory.

    When this returns the new content is durable; if the process dies earlier, `path` still
    holds its previous content (a leftover temp file is all that remains of the attempt).
    With `sync=False` nothing is fsynced here: the returned job does it (off the event loop),
    and until it ran a power loss can leave `path` torn, so only for files whose readers
    detect damage (a CRC) and can do without them.
    """
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            fsync(fd, tmp)
    except BaseException:
        os.close(fd)
        raise
    if sync:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)
        return None

    def finish() -> None:
        try:
            fsync(fd, path)
        finally:
            os.close(fd)
        fsync_dir(path.parent)
    return finish
