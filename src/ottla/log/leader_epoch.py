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

Becoming leader writes the new epoch's entry (two fsyncs), and so does a follower's first
fetched batch of a new epoch. A LeaderAndIsr that makes this broker leader of hundreds of
partitions, and a fetch response that brings hundreds of partitions their new leader's
first batches (a restarted follower), write them ahead in worker threads (`assign_ahead`), so
the `assign` on the event loop finds the file current; writes are serialised per cache by a
lock, and the file always holds what `_in_file` says.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from pathlib import Path
from typing import Callable, NamedTuple

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


def _write_checkpoint(path: Path, entries: list[EpochEntry]) -> None:
    """Temp file, fsync, rename, fsync of the directory: a crash leaves the old or the new file."""
    text = "\n".join([str(_VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        # The entries differ from the file's after a load's fit (`deferred`): written before
        # anything else changes or is appended.
        self._unwritten = False
        self._write_lock = threading.Lock()  # the loop's flush and a worker's write-ahead

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

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`, on the append of a batch stamped with
        an epoch newer than the latest (or starting before the latest entry's offset). Entries
        that would break monotonicity (an equal or newer epoch, or a start at or after this
        one) are removed, as Kafka does. Returns whether the cache changed."""
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
        self.flush()
        return True

    def assign_ahead(self, epoch: int, start_offset: int) -> Callable[[], None] | None:
        """Called on the event loop before an `assign(epoch, start_offset)` that is due soon (a
        new leadership, a fetched batch of a newer epoch): the durable write of the entries it
        will make, for a worker thread, so that `assign` finds the file current. None when
        `assign` would write nothing. The write is skipped if the cache or its file changed
        meanwhile: whoever changed them writes the file after the change."""
        basis, file_basis = self.entries, self._in_file
        if epoch < 0 or start_offset < 0 or (basis and epoch == basis[-1].epoch
                                             and start_offset >= basis[-1].start_offset):
            return None
        planned = list(basis)
        while planned and (planned[-1].epoch >= epoch or planned[-1].start_offset >= start_offset):
            planned.pop()
        planned.append(EpochEntry(epoch, start_offset))
        if planned == file_basis:
            return None

        def write() -> None:
            with self._write_lock:
                if self._in_file == file_basis and self.entries == basis:
                    _write_checkpoint(self.path, planned)
                    self._in_file = planned

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
            self._unwritten = self.entries != self._in_file
        else:
            self.flush()

    def flush(self) -> None:
        """Write the entries through, unless the file holds them already."""
        self._write(self.entries)
        self._unwritten = False

    def _write(self, entries: list[EpochEntry]) -> None:
        with self._write_lock:
            if entries != self._in_file:
                _write_checkpoint(self.path, entries)
                self._in_file = entries


def entries_from_batches(headers) -> list[EpochEntry]:
    """Rebuild the entries from batch headers in offset order: one entry where the stamped
    epoch first rises (batches written before leader epochs carry -1 and are skipped)."""
    entries: list[EpochEntry] = []
    for header in headers:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
            entries.append(EpochEntry(epoch, header.base_offset))
    return entries


def fit_to_log(cache: LeaderEpochCache, usable: bool, segments, log_start_offset: int, log_end_offset: int) -> None:
    """Fit a loaded cache to its loaded log: rebuilt from every batch header when its file was
    missing or corrupt, then cut to [log start, log end) as Kafka's LogLoader does (the
    checkpoint is written before the batches it describes are durable). The cut is written
    with the next change or append (`LeaderEpochCache.assign`): until then a crash leaves the
    file as it was, and the next load cuts it the same way."""
    if not usable and log_end_offset > log_start_offset:
        cache.replace(entries_from_batches(
            h for s in segments for h in s.headers_from(0) if h.base_offset < log_end_offset))
    cache.truncate_from_end(log_end_offset, deferred=True)
    cache.truncate_from_start(log_start_offset, deferred=True)
