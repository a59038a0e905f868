"""CPU of one replication round's requests with many partitions, in-process (no sockets).

- leader: one follower Fetch v12 of `--partitions` partitions, all at the log end (nothing
  new: what a follower sends after each round), through the Fetch handler with
  min_bytes=0, so it answers at once: the read every follower fetch costs the leader.
- leader, a delayed follower fetch of those partitions (max_wait an hour) woken by an append
  to one of them: CPU from the append to the answer built (the wake-up's reads), what
  every acks=all round costs the leader once per follower.
- leader, the same follower fetching in its incremental fetch session (KIP-227, what Ottla's
  followers send): a Fetch naming nothing (nothing new), and one that waits and is woken by an
  append to one partition: what each round's two fetches per follower cost the leader.

    PYTHONPATH=src python benchmarks/replica_fetch.py [--partitions 333] [--rounds 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v12.response import FetchResponse
from kio.serial import entity_reader

from ottla.config import BrokerConfig
from ottla.protocol.codec import EncodedBody
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.handlers import fetch
from ottla.server.metadata_cache import PartitionState


def cpu_ms(run, rounds: int) -> tuple[float, float]:
    samples = []
    for _ in range(rounds):
        start = time.thread_time()
        run()
        samples.append((time.thread_time() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[-1]


async def wake_cpu_ms(broker, ctx, request, partition: int) -> float:
    """CPU (ms) from an append to `partition` until the delayed `request` has its answer."""
    task = asyncio.get_running_loop().create_task(fetch.handle(ctx, request))
    while not broker.replicas.delayed_fetches.watching(("wide", partition)):
        await asyncio.sleep(0)
    start = time.thread_time()
    broker.replicas.append("wide", partition, build_batch([Record(None, b"y" * 100)]), now_ms=int(time.time() * 1000))
    response = await task
    spent = (time.thread_time() - start) * 1000
    assert any(p.records for t in response.responses for p in t.partitions)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=333)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    n = args.partitions
    with tempfile.TemporaryDirectory() as root:
        broker = Broker(Path(root) / "data", BrokerConfig({}), host="127.0.0.1", port=0)
        broker.create_topic("wide", n, {})
        broker.replicas.apply_partition_states(
            [PartitionState("wide", p, 0, 1, (0, 1, 2), (0, 1, 2)) for p in range(n)])
        for p in range(n):
            broker.replicas.append("wide", p, build_batch([Record(None, b"x" * 100)]), now_ms=int(time.time() * 1000))
        request = fetch12.FetchRequest(
            cluster_id=None, replica_id=1, max_wait=timedelta(0), min_bytes=0, max_bytes=10 << 20,
            isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
            topics=(fetch12.FetchTopic(topic="wide", partitions=tuple(
                fetch12.FetchPartition(partition=p, current_leader_epoch=1, fetch_offset=1, last_fetched_epoch=1,
                                       log_start_offset=0, partition_max_bytes=1 << 20) for p in range(n))),))
        ctx = SimpleNamespace(broker=broker, api_version=12, response_type=FetchResponse)
        loop = asyncio.new_event_loop()
        leader = cpu_ms(lambda: loop.run_until_complete(fetch.handle(ctx, request)), args.rounds)
        delayed = replace(request, max_wait=timedelta(hours=1), min_bytes=1)
        woken = []
        for i in range(args.rounds):
            woken.append(loop.run_until_complete(wake_cpu_ms(broker, ctx, delayed, i % n)))
            request = replace(request, topics=(replace(request.topics[0], partitions=tuple(
                replace(p, fetch_offset=broker.replicas.get_partition("wide", p.partition).log_end_offset)
                for p in request.topics[0].partitions)),))
            delayed = replace(request, max_wait=timedelta(hours=1), min_bytes=1)
        woken.sort()
        session, session_woken = loop.run_until_complete(session_cpu_ms(broker, ctx, request, n, args.rounds))
        loop.close()
        broker.logs.close()
    print(f"| {n} partitions, CPU per request (median / max of {args.rounds}) | ms |")
    print("| --- | ---: |")
    print(f"| leader: follower Fetch v12, nothing new, handler | {leader[0]:.2f} / {leader[1]:.2f} |")
    print(f"| leader: the same fetch delayed, woken by an append to one partition: append to answer "
          f"| {statistics.median(woken):.2f} / {woken[-1]:.2f} |")
    print(f"| leader: follower Fetch v12 in its session (incremental), nothing new, handler "
          f"| {session[0]:.2f} / {session[1]:.2f} |")
    print(f"| leader: the same, delayed and woken by an append to one partition, handler "
          f"| {session_woken[0]:.2f} / {session_woken[1]:.2f} |")


async def session_cpu_ms(broker, ctx, request, n: int, rounds: int) -> tuple[tuple, tuple]:
    """What a follower's fetcher sends once its session exists (KIP-227): CPU of the handler
    for an incremental Fetch naming nothing (nothing new anywhere), and for one that waits and
    is woken by an append to one partition (start to answer, the append included)."""
    response = await fetch.handle(ctx, replace(request, session_epoch=0))  # makes the session
    if isinstance(response, EncodedBody):  # nothing in it: answered encoded
        response, _ = entity_reader(FetchResponse)(bytes(response), 0)
    session_id, epoch = response.session_id, 1
    quiet, woken = [], []
    for i in range(rounds):
        empty = replace(request, topics=(), session_id=session_id, session_epoch=epoch)
        start = time.thread_time()
        await fetch.handle(ctx, empty)
        quiet.append((time.thread_time() - start) * 1000)
        epoch += 1
        partition = i % n
        start = time.thread_time()
        task = asyncio.get_running_loop().create_task(fetch.handle(ctx, replace(
            empty, session_epoch=epoch, max_wait=timedelta(hours=1), min_bytes=1)))
        while not broker.replicas.delayed_fetches.watching(("wide", partition)):
            await asyncio.sleep(0)
        broker.replicas.append("wide", partition, build_batch([Record(None, b"y" * 100)]),
                               now_ms=int(time.time() * 1000))
        await task
        woken.append((time.thread_time() - start) * 1000)
        epoch += 1
        moved = broker.replicas.get_partition("wide", partition).log_end_offset  # the follower has it
        await fetch.handle(ctx, replace(empty, session_epoch=epoch, topics=(replace(
            request.topics[0], partitions=(replace(request.topics[0].partitions[partition], fetch_offset=moved),)),)))
        epoch += 1
    quiet.sort()
    woken.sort()
    return (statistics.median(quiet), quiet[-1]), (statistics.median(woken), woken[-1])


if __name__ == "__main__":
    main()
