"""Kafka's log layer: partition logs made of segments with sparse indexes, and their manager."""

from .log import AppendResult, FetchData, Log, TimestampOffset
from .manager import LogManager, TopicInfo, validate_topic_name

__all__ = ["AppendResult", "FetchData", "Log", "LogManager", "TimestampOffset", "TopicInfo", "validate_topic_name"]
