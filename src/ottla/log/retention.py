"""Which of a log's oldest segments retention deletes (Kafka's UnifiedLog
`deleteRetentionMsBreachedSegments` and `deleteRetentionSizeBreachedSegments`, in one pass)."""

from __future__ import annotations

from ..config import TopicConfig
from .segment import LogSegment

__all__ = ["segments_past_retention"]


def segments_past_retention(segments: list[LogSegment], bases: list[int], high_watermark: int,
                            config: TopicConfig, now_ms: int) -> int:
    """How many segments, oldest first, are past retention.ms or beyond retention.bytes:
    counting stops at the first one that must stay; never the active segment, never data
    above the HW; none unless cleanup.policy has "delete"."""
    if "delete" not in config["cleanup.policy"]:
        return 0
    retention_ms, retention_bytes = config["retention.ms"], config["retention.bytes"]
    excess = sum(s.size for s in segments) - retention_bytes if retention_bytes >= 0 else 0
    deleted = 0
    for segment, next_base in zip(segments, bases[1:]):
        if next_base > high_watermark:
            break
        largest = segment.max_timestamp_and_offset()[0]
        if largest < 0:  # no record timestamps: fall back to the file's age, as Kafka does
            largest = int(segment.log_path.stat().st_mtime * 1000)
        expired = retention_ms >= 0 and now_ms - largest > retention_ms
        oversized = excess - segment.size >= 0 and retention_bytes >= 0
        if not (expired or oversized):
            break
        excess -= segment.size
        deleted += 1
    return deleted
