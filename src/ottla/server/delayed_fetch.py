"""Fetches waiting for data (Kafka's `DelayedFetch` in its `DelayedOperationPurgatory`).

A fetch that has fewer than `min_bytes` to answer waits here until one of its partitions may
have more (an append, a high-watermark move, a role change: `notify`) or its `max_wait`
passes. Consumers long-polling together have their waits fall due together, and asyncio runs
every due timer in one loop iteration, then every task those make ready in the next: 2,000
consumers answered at once held the loop for 226-269 ms of CPU, and one append woke every
fetch on its partition at once too (docs/performance.md, "Event-loop holds"). So:

- as in Kafka's timing wheel, a deadline is rounded up to the next `TICK_S` and the fetches
  of one tick share one timer (a fetch is answered at most a tick after its `max_wait`,
  never before); no timer, timeout context or cancellation per request;
- due and woken fetches join one queue, completed at most `WAKE_SLICE` per loop iteration in
  the order they became due (by deadline, then arrival; woken ones as woken), the loop free
  in between: each completion resumes a handler that reads its partitions and answers;
- followers' fetches go first, in a queue of their own: an acks=all produce waits for the
  follower's next fetch, which one append on a partition that thousands of consumers
  long-poll queued behind all of them. Kafka's purgatory completes a follower's delayed fetch
  in the appending thread itself, before the consumers' (its `checkAndComplete` runs them
  in watch order, but the follower fetches again right after its answer, so it is first).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Iterable

TopicPartition = tuple[str, int]

TICK_S = 0.01
# Handlers resumed per loop iteration: an empty answer costs 0.1-0.3 ms of the loop's CPU on a
# loaded machine, and the same iteration also takes up to 256 new requests (`event_loop.py`).
WAKE_SLICE = 32


class DelayedFetches:
    def __init__(self, wake_slice: int = WAKE_SLICE, tick_s: float = TICK_S):
        self.wake_slice = wake_slice
        self.tick_s = tick_s
        # Per partition, the fetches watching it: dicts as ordered sets (a departing fetch
        # leaves in O(1): 5,000 consumers closing on one partition), or the one fetch itself:
        # a dict holding a future is an object the cyclic collector tracks, and a consumer
        # long-polling 200,000 partitions alone added 200,000 to each full collection's walk.
        self._watchers: dict[TopicPartition, dict[asyncio.Future, None] | asyncio.Future] = {}
        # Per tick (deadline // tick_s, rounded up): its fetches and its one timer.
        self._ticks: dict[int, tuple[dict[asyncio.Future, None], asyncio.TimerHandle]] = {}
        # (fetch, woken by data) to complete, oldest first; a fetch may be in it twice (due and
        # woken before its turn): the second finds it done.
        self._due: deque[tuple[asyncio.Future, bool]] = deque()
        self._replica_due: deque[tuple[asyncio.Future, bool]] = deque()  # followers': before `_due`
        self._replicas: set[asyncio.Future] = set()
        self._by_replica: dict[int, dict[asyncio.Future, None]] = {}  # followers' fetches by broker id
        self._draining = False
        # The `notified` sets of the fetches that asked for one (`wait`).
        self._notified: dict[asyncio.Future, set[TopicPartition]] = {}
        # The sets of `recording`, by id: fetches reading their partitions in several steps.
        self._recorders: dict[int, set[TopicPartition]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def watching(self, key: TopicPartition) -> int:
        """How many fetches wait for this partition."""
        waiters = self._watchers.get(key)
        return 0 if waiters is None else len(waiters) if type(waiters) is dict else 1

    async def wait(self, keys: Iterable[TopicPartition], timeout_s: float,
                   notified: set[TopicPartition] | None = None, replica_id: int = -1) -> bool:
        """Until any of `keys` may have more to read (True) or `timeout_s` has passed or
        `complete_followers` ended the wait (False). `notified`, if given, collects the keys
        notified meanwhile: only they can read differently (a follower's fetch re-reads those,
        `handlers/fetch.py`). A follower's fetch (`replica_id` >= 0) is completed before any
        consumer's."""
        loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        watchers = self._watchers
        for key in keys:
            waiters = watchers.get(key)
            if waiters is None:
                watchers[key] = future
            elif type(waiters) is dict:
                waiters[future] = None
            else:
                watchers[key] = {waiters: None, future: None}
        if notified is not None:
            self._notified[future] = notified
        if replica_id >= 0:
            self._replicas.add(future)
            self._by_replica.setdefault(replica_id, {})[future] = None
        tick = math.ceil((loop.time() + timeout_s) / self.tick_s)
        entry = self._ticks.get(tick)
        if entry is None:
            entry = self._ticks[tick] = ({}, loop.call_at(tick * self.tick_s, self._expire, tick))
        entry[0][future] = None
        try:
            return await future
        finally:  # also when cancelled (its connection closed)
            self._notified.pop(future, None)
            self._replicas.discard(future)
            if replica_id >= 0:
                fetches = self._by_replica.get(replica_id)
                if fetches is not None:
                    fetches.pop(future, None)
                    if not fetches:
                        del self._by_replica[replica_id]
            for key in keys:
                waiters = watchers.get(key)
                if waiters is future:
                    del watchers[key]
                elif type(waiters) is dict:
                    waiters.pop(future, None)
                    if not waiters:
                        del watchers[key]
            entry = self._ticks.get(tick)
            if entry is not None:
                entry[0].pop(future, None)
                if not entry[0]:
                    entry[1].cancel()
                    del self._ticks[tick]

    def recording(self) -> set[TopicPartition]:
        """A set that collects every key notified from now until `stop_recording`. A fetch
        naming thousands of partitions reads them in steps, giving the loop turns between
        them, and watches them only once it waits: an append between two steps to a partition
        it has already read would wake nothing. It learns of it here and reads again."""
        keys: set[TopicPartition] = set()
        self._recorders[id(keys)] = keys
        return keys

    def stop_recording(self, keys: set[TopicPartition]) -> None:
        self._recorders.pop(id(keys), None)

    def notify(self, key: TopicPartition) -> None:
        """The partition may have more to read: wake the fetches watching it."""
        for recorder in self._recorders.values():
            recorder.add(key)
        waiters = self._watchers.pop(key, None)
        if waiters is not None:
            if type(waiters) is not dict:
                waiters = (waiters,)
            for future in waiters:
                notified = self._notified.get(future)
                if notified is not None:
                    notified.add(key)
            self._queue(waiters, True)

    def complete_followers(self, replica_ids: Iterable[int]) -> None:
        """Answer now the waiting fetches of these followers, with whatever they have (as at
        their max_wait). This broker just became leader of a partition they replicate, or
        started a new leader epoch of one: they have to send a request for it (truncation, a
        fetch in the new epoch) and a fetcher sends one request at a time, so a long poll of
        their other partitions held that back, up to replica.fetch.wait.max.ms, and acks=all on
        the partition with it (Kafka completes the delayed requests of the partitions whose
        role changed; here those fetches do not name the partition yet)."""
        for replica_id in replica_ids:
            fetches = self._by_replica.get(replica_id)
            if fetches:
                self._queue(list(fetches), False)

    def _expire(self, tick: int) -> None:
        entry = self._ticks.pop(tick, None)
        if entry is not None:
            self._queue(entry[0], False)

    def _queue(self, futures: Iterable[asyncio.Future], woken: bool) -> None:
        replicas = self._replicas
        if replicas:
            for future in futures:
                (self._replica_due if future in replicas else self._due).append((future, woken))
        else:
            self._due.extend((future, woken) for future in futures)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if not self._draining:
            self._draining = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Complete the next `wake_slice` fetches; the rest in the next loop iteration."""
        completed = 0
        for due in (self._replica_due, self._due):
            while due and completed < self.wake_slice:
                future, woken = due.popleft()
                if not future.done():
                    future.set_result(woken)
                    completed += 1
        self._draining = bool(self._replica_due or self._due)
        if self._draining:
            self._loop.call_soon(self._drain)
