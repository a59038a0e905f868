"""The Metadata handler's cost in-process: an all-topics Metadata v12 answered from a metadata
cache of one topic with --partitions partitions (RF 3, 3 brokers), handler and encoding
timed apart, in CPU time of this process (`time.process_time`, so a shared machine's load
counts less). "after a change": the cache changes before every request (a leader moves), so
nothing built for the previous answer can be reused; "unchanged": the same cache each time.

    PYTHONPATH=src python benchmarks/metadata_path.py [--partitions 1000] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from types import SimpleNamespace

from kio.schema.metadata.v12.request import MetadataRequest

from ottla.protocol.codec import encode_response
from ottla.server.context import RequestContext
from ottla.server.handlers import metadata
from ottla.server.metadata_cache import BrokerInfo, MetadataCache, PartitionState


def replicas(p: int) -> tuple[int, ...]:
    return tuple((p + k) % 3 + 1 for k in range(3))


async def measure(partitions: int, requests: int, change: bool) -> tuple[float, float, int]:
    cache = MetadataCache(1, "cluster")
    cache.update(controller_id=1, controller_epoch=1, brokers=[BrokerInfo(b, "127.0.0.1", 9090 + b) for b in (1, 2, 3)],
                 partition_states=[PartitionState("big", p, replicas(p)[0], 0, replicas(p), replicas(p))
                                   for p in range(partitions)], topic_ids={"big": uuid.uuid4()}, full=True)
    broker = SimpleNamespace(metadata=cache, config={"auto.create.topics.enable": False}, membership=None)
    ctx = RequestContext(broker, metadata.API_KEY, 12, None, "bench")
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    handler = encode = 0.0
    size = 0
    for i in range(requests):
        if change:
            cache.update_from_leader_and_isr([PartitionState("big", 0, replicas(0)[i % 3], i + 1, replicas(0), replicas(0))])
        started = time.process_time()
        response = await metadata.handle(ctx, request)
        handled = time.process_time()
        chunks = encode_response(metadata.API_KEY, 12, i, response)
        encode += time.process_time() - handled
        handler += handled - started
        size = sum(len(c) for c in chunks)
    return handler / requests * 1000, encode / requests * 1000, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    print(f"| Metadata v12, all topics, {args.partitions:,} partitions, in-process CPU per request "
          f"| response | handler | encoding |")
    print("| --- | --- | --- | --- |")
    for name, change in (("the cache changed before each request", True), ("the cache unchanged", False)):
        handler, encode, size = asyncio.run(measure(args.partitions, args.requests, change))
        print(f"| {name} | {size:,} B | {handler:.2f} ms | {encode:.2f} ms |")


if __name__ == "__main__":
    main()
