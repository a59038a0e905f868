"""Producer state snapshot files: `<20-digit offset>.snapshot` in the partition directory.

A snapshot at offset N holds the producer state after every batch below N, so loading one
and replaying the log from N rebuilds the state without reading the whole partition.

Unlike Kafka's snapshot (which keeps only each producer's last batch), ours keeps every
retained batch, so retries in flight across a broker restart are still recognised as
duplicates. Layout, big endian:

    version i16 | crc u32 (CRC-32C of everything after it) | offset i64 | count i32 |
    count x (producer_id i64 | epoch i16 | coordinator_epoch i32 | last_timestamp i64 |
             last_offset i64 | txn_first_offset i64 (-1: none) | batch_count u8 |
             batch_count x (first_seq i32 | last_seq i32 | first_offset i64 |
                            last_offset i64 | timestamp i64))
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from ..records.crc import crc32c

from ._files import TEMP_SUFFIX, atomic_write
from .entry import BatchMetadata, ProducerEntry

SUFFIX = ".snapshot"
VERSION = 1

_NAME = re.compile(r"^(\d{20})\.snapshot$")
_PREFIX = struct.Struct(">hI")
_BODY_HEAD = struct.Struct(">qi")
_ENTRY = struct.Struct(">qhiqqqB")
_BATCH = struct.Struct(">iiqqq")
MAX_BATCHES_PER_ENTRY = 255  # batch_count is a u8


class CorruptSnapshotError(Exception):
    """The file is not a snapshot we wrote completely: skip it and fall back to an older one."""


def snapshot_path(log_dir: Path, offset: int) -> Path:
    return log_dir / f"{offset:020d}{SUFFIX}"


def list_snapshots(log_dir: Path) -> list[int]:
    """Offsets of the snapshot files in `log_dir`, ascending."""
    offsets = []
    for path in log_dir.iterdir():
        match = _NAME.match(path.name)
        if match:
            offsets.append(int(match.group(1)))
    return sorted(offsets)


def remove_temp_files(log_dir: Path) -> None:
    """Delete half-written snapshots left by a crash during `write_snapshot`."""
    for path in log_dir.glob(f"*{SUFFIX}{TEMP_SUFFIX}"):
        path.unlink(missing_ok=True)


def encode(offset: int, entries: Iterable[ProducerEntry]) -> bytes:
    entries = list(entries)
    parts = [_BODY_HEAD.pack(offset, len(entries))]
    for e in entries:
        if len(e.batches) > MAX_BATCHES_PER_ENTRY:
            raise ValueError(
                f"producer {e.producer_id} keeps {len(e.batches)} batches, at most {MAX_BATCHES_PER_ENTRY} fit"
            )
        txn = -1 if e.txn_first_offset is None else e.txn_first_offset
        parts.append(
            _ENTRY.pack(
                e.producer_id, e.epoch, e.coordinator_epoch, e.last_timestamp, e.last_offset, txn, len(e.batches)
            )
        )
        parts.extend(_BATCH.pack(*b) for b in e.batches)
    body = b"".join(parts)
    return _PREFIX.pack(VERSION, crc32c(body)) + body


def decode(data: bytes) -> tuple[int, list[ProducerEntry]]:
    """Parse a snapshot; raise CorruptSnapshotError on any damage or unknown version."""
    try:
        version, crc = _PREFIX.unpack_from(data, 0)
        if version != VERSION:
            raise CorruptSnapshotError(f"unknown snapshot version {version}")
        body = memoryview(data)[_PREFIX.size :]
        if crc32c(body) != crc:
            raise CorruptSnapshotError("CRC mismatch")
        offset, count = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        entries = []
        for _ in range(count):
            pid, epoch, coordinator_epoch, last_ts, last_offset, txn, n = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            batches = []
            for _ in range(n):
                batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(
                ProducerEntry(
                    producer_id=pid,
                    epoch=epoch,
                    batches=tuple(batches),
                    last_timestamp=last_ts,
                    last_offset=last_offset,
                    coordinator_epoch=coordinator_epoch,
                    txn_first_offset=None if txn < 0 else txn,
                )
            )
    except struct.error as exc:
        raise CorruptSnapshotError(f"truncated snapshot: {exc}") from None
    if pos != len(body):
        raise CorruptSnapshotError(f"{len(body) - pos} unexpected trailing bytes")
    return offset, entries


def write_snapshot(log_dir: Path, offset: int, entries: Iterable[ProducerEntry], *, sync: bool = True
                   ) -> Callable[[], None] | None:
    """Durably write the snapshot for `offset` (atomic: temp file, fsync, rename, dir fsync);
    with `sync=False`, return the job that does the fsyncs (see _files.atomic_write: a torn
    snapshot fails its CRC and is skipped)."""
    return atomic_write(snapshot_path(log_dir, offset), encode(offset, entries), sync=sync)


def read_snapshot(log_dir: Path, offset: int) -> list[ProducerEntry]:
    path = snapshot_path(log_dir, offset)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorruptSnapshotError(f"cannot read {path.name}: {exc}") from None
    stored_offset, entries = decode(data)
    if stored_offset != offset:
        raise CorruptSnapshotError(f"{path.name} holds the state at offset {stored_offset}")
    return entries
