"""The aborted-transaction index of one log segment (Kafka's `.txnindex`).

read_committed consumers must drop the records of aborted transactions. Rather than scanning
the log for ABORT markers at fetch time, the log appends one fixed-size entry here whenever it
writes an ABORT marker, and a fetch asks the index which aborted transactions overlap the
offsets it returns (they go into the fetch response's `aborted_transactions`).

Entry layout, 34 bytes big-endian, identical to Kafka's:
    version int16 (0) | producer_id int64 | first_offset int64 | last_offset int64 |
    last_stable_offset int64
`last_offset` is the offset of the ABORT marker; `last_stable_offset` is the partition's LSO
once this transaction is done. Entries are ordered by `last_offset`, and since the LSO only
moves forward, also by `last_stable_offset` - which is what lets a search stop early.

The entry goes into the segment that holds the marker, even when the transaction began in an
earlier segment; that is why a search continues into later segments until it is complete.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ..durability import fsync

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size
ENTRY_VERSION = 0
SUFFIX = ".txnindex"


class CorruptIndexError(Exception):
    """The index file cannot be trusted; rebuild it from the segment (see `reset`)."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    aborted: list[AbortedTxn]
    # True when no later segment can hold an aborted transaction overlapping the range.
    complete: bool


def index_path(log_dir: Path, base_offset: int) -> Path:
    return log_dir / f"{base_offset:020d}{SUFFIX}"


class _Completed(Protocol):
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


def aborted_entries(completed: Sequence[_Completed], first_unstable_offset: int | None) -> list[AbortedTxn]:
    """Index entries for the transactions one append ended, in marker order.

    `first_unstable_offset` is the producer state's after the append. Each entry's LSO is the
    first offset of a transaction still open when its marker was written - including those
    the same append ends later - else the offset after its marker. An LSO too high would end
    a search before it reaches a later segment's entries, so it must never be overestimated.
    """
    entries = []
    for i, txn in enumerate(completed):
        still_open = [t.first_offset for t in completed[i + 1:]]
        if first_unstable_offset is not None:
            still_open.append(first_unstable_offset)
        if txn.is_aborted:
            lso = min(still_open) if still_open else txn.last_offset + 1
            entries.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso))
    return entries


class TransactionIndex:
    """Entries are parsed once when the segment opens and kept in memory (there is one per
    aborted transaction, so they are few); the file only ever grows by appends and shrinks by
    truncation. The file is created with the first entry: most segments never get one."""

    def __init__(self, path: Path, start_offset: int):
        self.path = Path(path)
        self.start_offset = start_offset
        self._entries: list[AbortedTxn] = []
        self._file = None
        self._torn_bytes = 0
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        whole = len(data) - len(data) % ENTRY_SIZE
        self._torn_bytes = len(data) - whole
        for (version, *fields) in _ENTRY.iter_unpack(data[:whole]):
            if version != ENTRY_VERSION:
                raise CorruptIndexError(f"{self.path}: unknown entry version {version}")
            self._entries.append(AbortedTxn(*fields))

    @property
    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    @property
    def last_offset(self) -> int | None:
        return self._entries[-1].last_offset if self._entries else None

    def append(self, txn: AbortedTxn) -> None:
        """Record an aborted transaction; called right after its ABORT marker is appended."""
        if self._entries and txn.last_offset <= self._entries[-1].last_offset:
            raise ValueError(f"{self.path}: aborted transaction ending at {txn.last_offset} is not "
                             f"after the last entry ({self._entries[-1].last_offset})")
        if self._torn_bytes:
            raise CorruptIndexError(f"{self.path}: appending after a torn entry; recover first")
        self._writer().write(_ENTRY.pack(ENTRY_VERSION, txn.producer_id, txn.first_offset,
                                         txn.last_offset, txn.last_stable_offset))
        self._file.flush()
        self._entries.append(txn)

    def flush(self) -> None:
        """fsync, together with the segment's own flush."""
        if self._file is not None:
            fsync(self._file.fileno(), self.path)

    def duplicate_fd(self) -> int | None:
        """For an fsync later, off the event loop (a segment sealed at roll)."""
        return os.dup(self._file.fileno()) if self._file is not None else None

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions overlapping [fetch_offset, upper_bound_offset).

        `upper_bound_offset` is the offset just past the last batch the fetch returns. The
        result is complete once an entry's LSO reaches the bound: every transaction that
        still overlapped the range was finished by then, so later segments add nothing.
        """
        aborted = []
        for txn in self._entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                aborted.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(aborted, True)
        return TxnIndexSearchResult(aborted, False)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose ABORT marker is at or after `offset` (log truncation)."""
        keep = len(self._entries)
        while keep and self._entries[keep - 1].last_offset >= offset:
            keep -= 1
        if keep != len(self._entries) or self._torn_bytes:
            self._truncate_file(keep)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError if the file is torn or holds an entry before the segment."""
        if self._torn_bytes:
            raise CorruptIndexError(f"{self.path}: {self._torn_bytes} trailing bytes of a torn entry")
        for txn in self._entries:
            if txn.last_offset < self.start_offset:
                raise CorruptIndexError(f"{self.path}: entry {txn} ends before the segment "
                                        f"start {self.start_offset}")

    def drop_torn_entry(self) -> bool:
        """Cut the partial entry a crash left behind; True if there was one.

        Safe only together with log recovery: the entry was being written for an ABORT marker
        appended after the last flush, so the log's recovery, which replays the unflushed
        segments, writes it again.
        """
        if not self._torn_bytes:
            return False
        self._truncate_file(len(self._entries))
        return True

    def reset(self) -> None:
        """Empty the index before rebuilding it while the segment is recovered."""
        self._truncate_file(0)

    def _truncate_file(self, keep: int) -> None:
        del self._entries[keep:]
        self._torn_bytes = 0
        if self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(keep * ENTRY_SIZE)

    def _writer(self):
        if self._file is None:
            self._file = open(self.path, "ab")
        return self._file

    def rename(self, path: Path) -> None:
        """Follow the segment when it is renamed (e.g. to `.deleted`, or swapped by the cleaner)."""
        if self.path.exists():
            os.replace(self.path, path)
        self.path = Path(path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def delete(self, *, unlink: bool = True) -> None:
        self.close()
        if unlink:
            self.path.unlink(missing_ok=True)
