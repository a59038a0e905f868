"""Fetched batches that stay in the segment file until the socket takes them (Kafka's FileRecords).

A Fetch response is encoded with a `FileRecords` in place of the record bytes: the encoder
writes its length and keeps it by reference, and the connection reads it a write slice at a
time as the socket drains. A consumer that never reads its responses therefore costs one
slice, not the whole `fetch.max.bytes` response (200 such consumers of an 8 MB log held
1.6 GB when responses were read whole).

The segment may change between encoding and sending: retention deletes it, a follower
truncates it, the cleaner swaps its files. Each of these bumps the segment's `version`; a
read after that, or one that comes back short, raises `RecordsGone` and the connection is
closed mid-frame, as Kafka closes it when its FileRecords was truncated during the write.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .segment import LogSegment

__all__ = ["FileRecords", "RecordsGone", "LAZY_MIN_BYTES"]

# Slices shorter than this are read at once: not worth a deferred read.
LAZY_MIN_BYTES = 64 * 1024


class RecordsGone(Exception):
    """The segment changed after the response was built: its bytes can no longer be sent."""


class FileRecords:
    __slots__ = ("segment", "position", "size", "_version")

    def __init__(self, segment: "LogSegment", position: int, size: int):
        self.segment = segment
        self.position = position
        self.size = size
        self._version = segment.version

    def __len__(self) -> int:
        return self.size

    def read(self, start: int, length: int) -> bytes:
        """`length` bytes from `start` within these records."""
        segment = self.segment
        if segment.version != self._version:
            raise RecordsGone(f"segment {segment.log_path} changed after the response was built")
        try:
            data = os.pread(segment.open_for_read(), length, self.position + start)
        except OSError as exc:
            raise RecordsGone(f"cannot read {segment.log_path}: {exc}") from None
        if len(data) != length:
            raise RecordsGone(f"segment {segment.log_path} was truncated after the response was built")
        return data
