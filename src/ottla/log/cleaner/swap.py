"""Swapping cleaned segments in, so that a crash at any step leaves old or new, never a mix.

Kafka's scheme, per cleaned group (one new segment replacing old segments [base, end)):

1. the cleaner thread writes `<base>.{log,index,timeindex,txnindex}.cleaned` and a
   `<base>.range.cleaned` holding `end`, all fsynced. A crash here: `.cleaned` files are
   deleted at load, the old segments stay.
2. on the event loop thread: every `.cleaned` becomes `.swap` (the range first, the `.log`
   last) and the directory is fsynced. A `.log.swap` is the commit point: from here on,
   recovery completes the swap.
3. the old segments' files are renamed `.deleted`;
4. the `.swap` files take the final names, the directory is fsynced, the `Log` switches to
   the new segment objects. `.deleted` files and ranges are removed afterwards.

`recover_swaps` (run when a Log loads) completes a group that reached its commit point (its
`.log.swap` exists, or its old `.log` was already renamed `.deleted`) and rolls back any
other: that is why the range is needed, since a cleaned segment can end well before the old
segments it replaces did.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ...durability import fsync
from ...failpoints import crash_at
from ...records.batch import HEADER_SIZE, read_header
from ..segment import segment_name
from .clean import CLEANED, RANGE, CleanedGroup, CleaningAborted

if TYPE_CHECKING:
    from ..log import Log
    from ..segment import LogSegment

__all__ = ["FAILPOINTS", "commit_swap", "recover_swaps", "remove_files"]

log = logging.getLogger(__name__)

SWAP = ".swap"
DELETED = ".deleted"
_SEGMENT_FILES = (".log", ".index", ".timeindex", ".txnindex")
_SWAP_ORDER = (RANGE, ".index", ".timeindex", ".txnindex", ".log")  # the .log last: it is the commit point

# Crash points of the swap, for OTTLA_FAILPOINTS (see ottla.failpoints).
FAILPOINTS = ("cleaner.after_cleaned", "cleaner.after_swap_files", "cleaner.after_old_deleted",
              "cleaner.after_swap_complete")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fsync(fd, directory)
    finally:
        os.close(fd)


def _rename_if_exists(source: Path, target: Path) -> None:
    try:
        os.replace(source, target)
    except FileNotFoundError:
        pass


def commit_swap(log_: "Log", expected: dict[int, "LogSegment"], groups: list[CleanedGroup],
                failpoints: frozenset[str] = frozenset()) -> list[Path]:
    """Steps 2-4 on the event loop thread. Raises CleaningAborted, changing nothing, when a
    segment the pass read is no longer in the log (retention, DeleteRecords, truncation or
    deletion got there first). Returns the `.deleted` and range files left to remove."""
    log_.finish_rebuild()  # it may be reading the segments about to be renamed
    current = {segment.base_offset: segment for segment in log_.segments}
    for group in groups:
        for base in group.replaced:
            if current.get(base) is not expected[base]:
                raise CleaningAborted(f"segment {base} of {log_.directory.name} changed while it was cleaned")
    directory = log_.directory
    for group in groups:
        name = segment_name(group.base)
        for ext in _SWAP_ORDER:
            _rename_if_exists(directory / f"{name}{ext}{CLEANED}", directory / f"{name}{ext}{SWAP}")
    _fsync_dir(directory)
    crash_at("cleaner.after_swap_files", failpoints)

    leftovers = []
    for group in groups:
        for base in group.replaced:
            expected[base].retire()
            name = segment_name(base)
            for ext in _SEGMENT_FILES:
                target = directory / f"{name}{ext}{DELETED}"
                _rename_if_exists(directory / f"{name}{ext}", target)
                leftovers.append(target)
    crash_at("cleaner.after_old_deleted", failpoints)

    for group in groups:
        name = segment_name(group.base)
        for ext in _SEGMENT_FILES:
            _rename_if_exists(directory / f"{name}{ext}{SWAP}", directory / f"{name}{ext}")
        leftovers.append(directory / f"{name}{RANGE}{SWAP}")
    _fsync_dir(directory)
    log_.replace_segments([(group.base, group.replaced) for group in groups])
    crash_at("cleaner.after_swap_complete", failpoints)
    return leftovers


def remove_files(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _next_offset(log_path: Path, base: int) -> int:
    """The offset after the last whole batch of a segment file (fallback for a lost range)."""
    data = log_path.read_bytes()
    position, next_offset = 0, base
    while len(data) - position >= HEADER_SIZE:
        header = read_header(data, position)
        if header.size < HEADER_SIZE or position + header.size > len(data):
            break
        next_offset = header.last_offset + 1
        position += header.size
    return next_offset


def recover_swaps(directory: Path) -> list[str]:
    """Finish or undo a swap a crash interrupted; then drop `.cleaned` and `.deleted` files.
    Returns the directory's file names after that (the log's load reads no second listing)."""
    listing = os.listdir(directory)
    names = set(listing)
    swap_bases = sorted({int(n.split(".", 1)[0]) for n in names if n.endswith(SWAP) and n.split(".", 1)[0].isdigit()})
    regular = sorted({int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit()})
    for base in swap_bases:
        name = segment_name(base)
        log_swap = f"{name}.log{SWAP}"
        if log_swap not in names and f"{name}.log{DELETED}" not in names:
            log.warning("rolling back an unfinished cleaner swap of segment %s in %s", name, directory.name)
            remove_files(directory / f"{name}{ext}{SWAP}" for ext in _SWAP_ORDER)
            continue
        range_path = directory / f"{name}{RANGE}{SWAP}"
        try:
            end = int(range_path.read_text())
        except (FileNotFoundError, ValueError):
            end = _next_offset(directory / log_swap, base) if log_swap in names else base + 1
        if log_swap in names:  # the old segments may still be in place
            for old in regular:
                if base <= old < end:
                    remove_files(directory / f"{segment_name(old)}{ext}" for ext in _SEGMENT_FILES)
        for ext in _SEGMENT_FILES:
            _rename_if_exists(directory / f"{name}{ext}{SWAP}", directory / f"{name}{ext}")
        remove_files([range_path])
        log.warning("completed an interrupted cleaner swap of segments [%d, %d) in %s", base, end, directory.name)
    leftovers = [n for n in names if n.endswith(CLEANED) or n.endswith(DELETED)]
    remove_files(directory / n for n in leftovers)
    if swap_bases:
        _fsync_dir(directory)
    return os.listdir(directory) if swap_bases or leftovers else listing
