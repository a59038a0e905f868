"""What the sink reads of Spark's TaskContext, for tests that drive a write task without Spark."""

from __future__ import annotations


class StreamingTaskContext:
    """Micro-batch `batch` of partition 0 of query q1."""

    def __init__(self, batch: int):
        self.props = {"streaming.sql.batchId": str(batch), "sql.streaming.queryId": "q1"}

    def partitionId(self):
        return 0

    def getLocalProperty(self, key):
        return self.props[key]
