"""DescribeLogDirs: the one log directory, with each partition's size on disk (UIs, ops tools),
and, for a v2+ request carrying Ottla's tag 10000, each compacted partition's dirty ratio
(`protocol/extensions.py`; `ottla topics describe` asks for it)."""

import asyncio
import shutil
from datetime import timedelta

from ...errors import ErrorCode
from ...log.cleaner.service import compacted
from ...protocol.build import make, nested
from ..clock import now_ms
from ..steps import producer_state_ready

API_KEY = 35
# v0 is v1 (removed in Kafka 4.0, KIP-896); v5 says whether a log directory is cordoned (Kafka
# 4.2's KIP-1066), which Ottla's one directory never is.
VERSIONS = (0, 5)


_YIELD_EVERY = 256


async def handle(ctx, request):
    logs = ctx.broker.logs
    response_type = ctx.response_type
    partition_type = nested(response_type, "DescribeLogDirsPartition")
    topic_type = nested(response_type, "DescribeLogDirsTopic")
    result_type = nested(response_type, "DescribeLogDirsResult")
    if request.topics is None:
        wanted = None
    else:
        wanted = {(t.topic, p) for t in request.topics for p in t.partitions}
    dirty = getattr(request, "dirty_ratio", False)
    cleaner, now = ctx.broker.cleaner, now_ms()
    by_topic: dict[str, list] = {}
    for count, ((topic, partition), log) in enumerate(sorted(logs.logs.items()), 1):
        if count % _YIELD_EVERY == 0:
            await asyncio.sleep(0)  # thousands of partitions: other connections go between
        if wanted is not None and (topic, partition) not in wanted:
            continue
        if (topic, partition) not in logs.logs:
            continue  # deleted while this request yielded
        if dirty and not log.producer_state_ready and compacted(log):
            await producer_state_ready(log)  # the ratio reads the LSO: loaded in steps
            if logs.logs.get((topic, partition)) is not log:
                continue  # deleted meanwhile
        size = sum(segment.size for segment in log.segments)
        stats = cleaner.dirty_stats((topic, partition), log, now) if dirty else None
        by_topic.setdefault(topic, []).append(make(partition_type, partition_index=partition, partition_size=size,
                                                   offset_lag=0, is_future_key=False,
                                                   dirty_ratio=None if stats is None else stats.ratio))
    usage = shutil.disk_usage(logs.data_dir)
    result = make(result_type, error_code=ErrorCode.none, log_dir=str(logs.data_dir.resolve()),
                  topics=tuple(make(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()),
                  total_bytes=usage.total, usable_bytes=usage.free, is_cordoned=False)
    return make(response_type, throttle_time=timedelta(0), error_code=ErrorCode.none, results=(result,))
