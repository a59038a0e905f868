"""A partition's leader epoch cache, Kafka's LeaderEpochFileCache (KIP-101, KIP-279).

Each entry `(epoch, start_offset)` says the leader of `epoch` wrote its first batch at
`start_offset`. Followers ask the leader for the end of their latest epoch
(OffsetsForLeaderEpoch) and truncate there instead of at their own high watermark, which is
what keeps acknowledged data through the crash schedules that lose or diverge it under
high-watermark truncation (seed 001).

Persisted as `<partition dir>/leader-epoch-checkpoint` in Kafka's text format (version line
`0`, the entry count, then `epoch start_offset` per line), rewritten atomically on each
change: changes are rare (once per leader change, truncation or log start move). What a load
cuts to fit the log is written only before the next change or append, and not at all when
that puts back what the file holds: an empty partition's entry `(epoch, 0)` is cut at every
load (it starts at the log end) and assigned again when the partition becomes leader, which
cost two fsynced writes per empty partition at every start.

Becoming leader need not wait for the new epoch's entry to be durable: `assign(...,
write=False)` changes the cache and `write_pending` writes it later from another thread. What makes that safe is
the log's, not this file's (`Log.start_leader_epoch`, docs/architecture.md "A new leader's
epoch entry"): the entry is re-derived by recovery from the batches that
carry the epoch, and it is written before the recovery point passes it. Writes are serialised
by a lock and always write the newest entries (`_published`), so a late write never puts
back an older list.

A follower's first fetched batch of a new epoch writes its entry on append; a restarted
follower gets such a batch for hundreds of partitions at once, and the fetcher writes those
entries ahead in worker threads (`assign_ahead`), so each `assign` on the event loop finds the
file current.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from pathlib import Path
from typing import Callable, NamedTuple

from ..durability import fsync

__all__ = ["LeaderEpochCache", "EpochEntry", "EpochEndOffset", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "CHECKPOINT_FILE"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochEndOffset(NamedTuple):
    """An OffsetsForLeaderEpoch answer: the largest epoch <= the one asked, and its end."""

    leader_epoch: int
    end_offset: int


_UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


class CorruptCheckpointError(ValueError):
    pass


def read_checkpoint(path: Path) -> list[EpochEntry] | None:
    """The entries of a checkpoint file; None when it is missing. Raises
    CorruptCheckpointError when it does not parse or is not monotonic."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(str(exc)) from None
    try:
        if not lines or int(lines[0]) != _VERSION:
            raise ValueError(f"unsupported version line {lines[:1]}")
        count = int(lines[1])
        if count != len(lines) - 2:
            raise ValueError(f"count line says {count}, found {len(lines) - 2} entries")
        entries = []
        for line in lines[2:]:
            epoch, offset = line.split()
            entries.append(EpochEntry(int(epoch), int(offset)))
    except (ValueError, IndexError) as exc:
        raise CorruptCheckpointError(f"{path}: {exc}") from None
    for before, after in zip(entries, entries[1:]):
        if not (before.epoch < after.epoch and before.start_offset <= after.start_offset):
            raise CorruptCheckpointError(f"{path}: entries {before} and {after} are not monotonic")
    if any(e.epoch < 0 or e.start_offset < 0 for e in entries):
        raise CorruptCheckpointError(f"{path}: negative epoch or offset")
    return entries


def _write_checkpoint(path: Path, entries: list[EpochEntry], directory_inode: int | None = None) -> None:
    """Temp file, fsync, rename, fsync of the directory: a crash leaves the old or the new file.
    Relative to the directory opened once, and only if it is still the partition's own
    (`directory_inode`): a write from another thread racing the partition's deletion lands in
    the renamed directory about to be removed, never in a new one of the same name."""
    text = "\n".join([str(_VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]) + "\n"
    tmp = path.name + ".tmp"
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if directory_inode is not None and os.fstat(dir_fd).st_ino != directory_inode:
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
        try:
            data = memoryview(text.encode("ascii"))
            while data:
                data = data[os.write(fd, data):]
            fsync(fd, path)
        finally:
            os.close(fd)
        os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        fsync(dir_fd, path.parent)
    finally:
        os.close(dir_fd)


class LeaderEpochCache:
    """Epoch -> start offset, both strictly increasing; every change is written through to
    the checkpoint file. `load` reports a file that fails to parse, and the log then rebuilds
    the entries from its batches."""

    def __init__(self, directory: Path, entries: list[EpochEntry] | None = None):
        self.path = Path(directory) / CHECKPOINT_FILE
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for entry in entries or ():
            self._epochs.append(entry.epoch)
            self._offsets.append(entry.start_offset)
        self._in_file = self.entries  # what the checkpoint file holds
        # The entries as of the owner's last change, for a write from another thread (the owner
        # changes the two lists in steps).
        self._published = self._in_file
        # The entries differ from the file's after a load's fit (`deferred`): written before
        # anything else changes or is appended.
        self._unwritten = False
        self._closed = False  # the partition was deleted: nothing more is written
        try:
            self._directory_inode: int | None = os.stat(directory).st_ino
        except FileNotFoundError:  # a scratch cache (tests) whose directory comes later
            self._directory_inode = None
        self._write_lock = threading.Lock()  # the owner's writes and `write_pending`
        # The cache the file was last written ahead of (`assign_ahead`): a deferred write of it
        # would only put back what the coming `assign` replaces.
        self._ahead_of: list[EpochEntry] | None = None

    @classmethod
    def load(cls, directory: Path) -> tuple["LeaderEpochCache", bool]:
        """The cache from the directory's checkpoint and whether the file was usable (False:
        missing or corrupt, so the caller rebuilds the entries from the log's batches)."""
        path = Path(directory) / CHECKPOINT_FILE
        try:
            entries = read_checkpoint(path)
        except CorruptCheckpointError as exc:
            log.warning("rebuilding leader epoch cache: %s", exc)
            return cls(directory), False
        return cls(directory, entries), entries is not None

    # -- queries -------------------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return [EpochEntry(e, o) for e, o in zip(self._epochs, self._offsets)]

    @property
    def unwritten(self) -> bool:
        """A load's cut the file does not hold yet (written before the next change)."""
        return self._unwritten

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose leader wrote `offset` (None below the first entry)."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Kafka's OffsetsForLeaderEpoch answer, `(epoch, end_offset)`:

        - the latest epoch: `(epoch, log_end_offset)` (it is still being written);
        - an older epoch the cache knows or spans: the largest known epoch <= it, and the start
          offset of the first epoch above it (where that leader's data ends);
        - older than every entry: `(requested_epoch, start of the earliest entry)`, since the
          data before it is gone anyway and the follower must start from there;
        - UNDEFINED_EPOCH, newer than the latest, or an empty cache: `(-1, -1)`.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return _UNDEFINED
        if requested_epoch == self._epochs[-1]:
            return EpochEndOffset(requested_epoch, log_end_offset)
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return _UNDEFINED
        if higher == 0:
            return EpochEndOffset(requested_epoch, self._offsets[0])
        return EpochEndOffset(self._epochs[higher - 1], self._offsets[higher])

    # -- changes -------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int, *, write: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset`, on the append of a batch stamped with
        an epoch newer than the latest (or starting before the latest entry's offset). Entries
        that would break monotonicity (an equal or newer epoch, or a start at or after this
        one) are removed, as Kafka does. Returns whether the cache changed. Without `write`
        the file is left to `write_pending` (the caller's duty: `Log.start_leader_epoch`)."""
        if epoch < 0 or start_offset < 0:
            return False  # batches from before leader epochs carry -1: nothing to record
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._offsets[-1]:
            if self._unwritten:  # the first append after a load's fit
                self.flush()
            return False
        removed = []
        while self._epochs and (self._epochs[-1] >= epoch or self._offsets[-1] >= start_offset):
            removed.append(EpochEntry(self._epochs.pop(), self._offsets.pop()))
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            log.warning("leader epoch %d at offset %d replaced conflicting entries %s in %s",
                        epoch, start_offset, removed, self.path)
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        if write:
            self.flush()
        else:
            self._published = self.entries
        return True

    def write_pending(self) -> None:
        """Write the newest entries if the file lacks them (any thread); not when the file was
        written ahead of them (the owner's `flush` puts them back if that `assign` never comes)."""
        self._write(None, unless_ahead=True)

    def close(self) -> None:
        """The partition is gone: nothing more is written. Without the lock, so the event loop
        never waits for a write in progress (that one checks the directory is still this
        partition's: `_write_checkpoint`)."""
        self._closed = True

    def recover_epochs(self, epoch_starts: list[EpochEntry]) -> None:
        """Recovery found these epochs starting in the batches it scanned: add those newer than
        the latest entry (Kafka's segment recovery assigns them the same way): a new leader's
        entry a crash kept out of the file starts above the recovery point the scan started at,
        so it is found again here. Anything added is written at once: the recovery point moves
        past it."""
        added = False
        for epoch, start in epoch_starts:
            if self.latest_epoch is None or epoch > self.latest_epoch:
                added |= self.assign(epoch, start, write=False)
        if added:
            self.flush()

    def assign_ahead(self, epoch: int, start_offset: int) -> Callable[[], None] | None:
        """Called on the event loop before an `assign(epoch, start_offset)` that is due soon (a
        follower's fetched batch of a newer epoch): the durable write of the entries it will
        make, for a worker thread, so that `assign` finds the file current. None when `assign`
        would write nothing. The write is skipped if the cache changed meanwhile: whoever
        changed it writes the file after the change (writes are serialised by the lock, so a
        change made while this one writes is written after it)."""
        basis = self._published
        if epoch < 0 or start_offset < 0 or (basis and epoch == basis[-1].epoch
                                             and start_offset >= basis[-1].start_offset):
            return None
        planned = list(basis)
        while planned and (planned[-1].epoch >= epoch or planned[-1].start_offset >= start_offset):
            planned.pop()
        planned.append(EpochEntry(epoch, start_offset))
        if planned == self._in_file:
            return None

        def write() -> None:
            with self._write_lock:
                if not self._closed and self._published == basis and self._in_file != planned:
                    _write_checkpoint(self.path, planned, self._directory_inode)
                    self._in_file, self._ahead_of = planned, basis

        return write

    def truncate_from_end(self, end_offset: int, *, deferred: bool = False) -> None:
        """The log was truncated to `end_offset`: drop the epochs starting at or after it.
        `deferred` (a load fitting the cache to its log): the file is written later."""
        if end_offset < 0 or not self._offsets or self._offsets[-1] < end_offset:
            return
        keep = bisect.bisect_left(self._offsets, end_offset)
        del self._epochs[keep:], self._offsets[keep:]
        self._changed(deferred)

    def truncate_from_start(self, start_offset: int, *, deferred: bool = False) -> None:
        """The log start moved to `start_offset`: drop entries wholly before it and move the
        start of the epoch that covers it up to it."""
        if start_offset < 0 or not self._offsets or self._offsets[0] >= start_offset:
            return
        last_before = bisect.bisect_right(self._offsets, start_offset) - 1
        epoch = self._epochs[last_before]
        del self._epochs[:last_before + 1], self._offsets[:last_before + 1]
        self._epochs.insert(0, epoch)
        self._offsets.insert(0, start_offset)
        self._changed(deferred)

    def clear(self) -> None:
        """The log was emptied (truncated fully)."""
        self._epochs.clear()
        self._offsets.clear()
        self.flush()

    def replace(self, entries: list[EpochEntry]) -> None:
        """Set every entry at once (a rebuild from the log's batches) and write the file."""
        self._epochs = [e.epoch for e in entries]
        self._offsets = [e.start_offset for e in entries]
        self.flush()

    def _changed(self, deferred: bool) -> None:
        if deferred:
            self._published = self.entries
            self._unwritten = self._published != self._in_file
        else:
            self.flush()

    def flush(self) -> None:
        """Write the entries through, unless the file holds them already."""
        self._published = self.entries
        self._write(None)
        self._unwritten = False

    def _write(self, entries: list[EpochEntry] | None, *, unless_ahead: bool = False) -> None:
        """Write `entries`, or (None) the newest published ones, under the lock: whichever
        write comes last writes the newest list."""
        with self._write_lock:
            if self._closed:
                return
            if entries is None:
                entries = self._published
                if unless_ahead and self._ahead_of is not None and self._ahead_of == entries:
                    return
            if entries != self._in_file:
                try:
                    _write_checkpoint(self.path, entries, self._directory_inode)
                except FileNotFoundError:
                    if self.path.parent.exists():
                        raise
                    return  # the directory was removed meanwhile (the partition deleted)
                self._in_file, self._ahead_of = entries, None


def entries_from_batches(headers) -> list[EpochEntry]:
    """Rebuild the entries from batch headers in offset order: one entry where the stamped
    epoch first rises (batches written before leader epochs carry -1 and are skipped)."""
    entries: list[EpochEntry] = []
    for header in headers:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
            entries.append(EpochEntry(epoch, header.base_offset))
    return entries


def fit_to_log(cache: LeaderEpochCache, usable: bool, segments, log_start_offset: int, log_end_offset: int,
               epoch_starts=()) -> None:
    """Fit a loaded cache to its loaded log: rebuilt from every batch header when its file was
    missing or corrupt, then cut to [log start, log end) as Kafka's LogLoader does (the
    checkpoint is written before the batches it describes are durable), then given the epochs
    recovery saw start in the batches it scanned (`epoch_starts`, after an unclean shutdown),
    which a checkpoint written after leading may lack. The cut is written with the next change
    or append (`LeaderEpochCache.assign`): until then a crash leaves the file as it was, and the
    next load cuts it the same way."""
    if not usable and log_end_offset > log_start_offset:
        cache.replace(entries_from_batches(
            h for s in segments for h in s.headers_from(0) if h.base_offset < log_end_offset))
    cache.truncate_from_end(log_end_offset, deferred=True)
    cache.truncate_from_start(log_start_offset, deferred=True)
    cache.recover_epochs([EpochEntry(e, max(o, log_start_offset)) for e, o in epoch_starts])
