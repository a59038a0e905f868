"""Kafka's log layer: partition logs made of segments with sparse indexes, and their manager."""

from .log import AppendResult, FetchData, Log
from .reads import OffsetAndTimestamp
from .manager import LogManager, TopicInfo, validate_topic_name

__all__ = [
    "AppendResult",
    "FetchData",
    "Log",
    "LogManager",
    "OffsetAndTimestamp",
    "TopicInfo",
    "validate_topic_name",
]
