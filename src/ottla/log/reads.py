"""Reads over a partition's segments: Fetch's whole batches with the aborted transactions
they overlap, and ListOffsets by timestamp. Nothing here changes the log."""

from __future__ import annotations

import bisect
from typing import NamedTuple

from ..records.batch import BatchHeader
from ..records.records import decode_batch
from .file_records import FileRecords
from .segment import LogSegment
from .txn_index import AbortedTxn

__all__ = ["OffsetAndTimestamp", "max_timestamp_offset", "offset_for_timestamp", "read_batches"]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


def read_batches(
    segments: list[LogSegment],
    bases: list[int],
    log_end_offset: int,
    fetch_offset: int,
    max_bytes: int,
    max_offset: int,
    min_one_batch: bool,
    with_aborted: bool,
    lazy: bool,
) -> tuple[bytes | memoryview | FileRecords, list[AbortedTxn] | None]:
    """`Log.read`'s records and, `with_aborted`, the aborted transactions they overlap; the
    offset is known to lie within the log. Like Kafka, one fetch reads from one segment."""
    records = b""
    aborted = [] if with_aborted else None
    if fetch_offset < max_offset:
        i = max(0, bisect.bisect_right(bases, fetch_offset) - 1)
        for j in range(i, len(segments)):
            segment = segments[j]
            if segment.base_offset >= max_offset:
                break
            header = segment.find(fetch_offset)
            if header is None:
                continue
            records = segment.read(header.position, max_bytes, max_offset, min_one_batch, lazy)
            if with_aborted and records:
                upper = bases[j + 1] if j + 1 < len(bases) else log_end_offset
                aborted = _collect_aborted(segments[j:], fetch_offset, upper)
            break
    return records, aborted


def _collect_aborted(segments: list[LogSegment], fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
    """A transaction's entry sits in the segment of its ABORT marker, which may come after
    the fetched one, so later segments are searched until the index says it is complete."""
    aborted = []
    for segment in segments:
        result = segment.txn_index.collect_aborted(fetch_offset, upper_bound)
        aborted += result.aborted
        if result.complete:
            break
    return aborted


def offset_for_timestamp(
    segments: list[LogSegment], log_start_offset: int, timestamp: int
) -> OffsetAndTimestamp | None:
    """ListOffsets by time: the first record with a timestamp >= `timestamp`, or None."""
    for segment in segments:
        if segment.max_timestamp_and_offset()[0] < timestamp:
            continue
        start = max(segment.time_index.lookup_before(timestamp), log_start_offset)
        first = segment.find(start)
        if first is None:
            continue
        for header in segment.headers_from(first.position):
            if header.max_timestamp < timestamp:
                continue
            for record in _records_of(segment, header):
                if record.timestamp >= timestamp and record.offset >= log_start_offset:
                    return OffsetAndTimestamp(record.offset, record.timestamp)
    return None


def max_timestamp_offset(segments: list[LogSegment]) -> OffsetAndTimestamp | None:
    """ListOffsets MAX_TIMESTAMP (-3): the first record carrying the largest timestamp; None if empty."""
    best = None
    for segment in segments:
        timestamp, batch_offset = segment.max_timestamp_and_offset()
        if timestamp >= 0 and (best is None or timestamp > best[1][0]):
            best = (segment, (timestamp, batch_offset))
    if best is None:
        return None
    segment, (timestamp, batch_offset) = best
    header = segment.find(batch_offset)
    for record in _records_of(segment, header):
        if record.timestamp == timestamp:
            return OffsetAndTimestamp(record.offset, timestamp)
    return OffsetAndTimestamp(header.base_offset, timestamp)


def _records_of(segment: LogSegment, header: BatchHeader):
    data = segment.read_batch(header)
    return decode_batch(data, header._replace(position=0))
