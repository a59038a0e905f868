"""Every fsync/fdatasync of the data dir goes through here, because a failed one is fatal.

After a failed fsync the kernel may already have dropped the dirty pages it could not write
and marked them clean: a retry "succeeds" and the data is silently gone (the PostgreSQL
fsyncgate). Kafka therefore takes the log directory offline at the first I/O error
(LogDirFailureChannel) and halts the broker when no log directory is left. Ottla has one log
directory, so it does the same in one step: `fsync_failed` logs one error line and halts the
process at once (exit status 1) -- nothing is acknowledged after the failure, and the next
start recovers from the recovery point, checking every batch's CRC. Library users (tests,
embedders) can replace the halt with `on_fsync_failure`. A sync that fails in another process
(the log cleaner's worker) comes back as its `LogDirOffline` and is handed to
`failed_elsewhere`, so it takes the directory offline the same way.

`OTTLA_FAILPOINTS=fsync.eio@TEXT` (test only, read at import) makes every sync of a file whose
path contains TEXT fail with EIO.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Callable

from .failpoints import from_environment as failpoints_from_environment

__all__ = ["fsync", "fdatasync", "on_fsync_failure", "failed_elsewhere", "LogDirOffline"]

log = logging.getLogger("ottla.durability")


class LogDirOffline(OSError):
    """Raised where a sync failed, if the failure handler lets the caller go on at all."""


def _halt(path: str, exc: OSError) -> None:
    log.critical("log directory offline: %s of %s failed (%s); no log directory is left, "
                 "halting without acknowledging anything more", "fsync", path, exc)
    logging.shutdown()
    os._exit(1)


_on_failure: Callable[[str, OSError], None] = _halt


def on_fsync_failure(handler: Callable[[str, OSError], None]) -> Callable[[str, OSError], None]:
    """Replace what a failed sync does (default: halt); returns the previous handler."""
    global _on_failure
    previous, _on_failure = _on_failure, handler
    return previous


def _failing_paths() -> tuple[str, ...]:
    return tuple(n[len("fsync.eio@"):] for n in failpoints_from_environment() if n.startswith("fsync.eio@"))


_FAILING = _failing_paths()


def _sync(call: Callable[[int], None], fd: int, path) -> None:
    try:
        if _FAILING and any(text in str(path) for text in _FAILING):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        call(fd)
    except OSError as exc:
        _on_failure(str(path), exc)
        raise LogDirOffline(exc.errno, f"sync of {path} failed: {exc.strerror}", str(path)) from exc


def failed_elsewhere(exc: LogDirOffline) -> None:
    """A sync failed in a worker process whose failure handler let it report back: apply
    this process's handler (by default, halt)."""
    _on_failure(exc.filename, OSError(exc.errno, os.strerror(exc.errno)))


def fsync(fd: int, path) -> None:
    """os.fsync(fd); `path` names the file for the failpoint and the log line."""
    _sync(os.fsync, fd, path)


def fdatasync(fd: int, path) -> None:
    """os.fdatasync(fd), as `fsync`."""
    _sync(os.fdatasync, fd, path)
