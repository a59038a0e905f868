"""Requests naming thousands of partitions are handled in steps (issue 11, F3: no single
request may hold the event loop for long): 200,000 partitions in one Produce held it for 1.9 s
of CPU, in one OffsetForLeaderEpoch 0.9 s, in one Fetch 1.8 s. A partition's producer state is
loaded on first use in steps too (`producer_state_ready`)."""

import asyncio
import logging
import weakref

logger = logging.getLogger(__name__)

# Topic and partition entries handled between two turns of the event loop (a few ms of work).
ENTRIES_PER_STEP = 256


class Steps:
    """Counts a request's topic and partition entries: every `ENTRIES_PER_STEP` of them the
    event loop gets a turn, so other connections go in between."""

    __slots__ = ("made", "yields")

    def __init__(self):
        self.made = 0
        self.yields = 0  # turns given so far: a handler that yielded knows the world moved meanwhile

    async def one(self) -> None:
        self.made += 1
        if self.made >= ENTRIES_PER_STEP:
            await self.turn()

    async def turn(self) -> None:
        """A turn now, for work inside one entry that is long (a Fetch v0-3 partition's
        down-conversion walk), counted as a step."""
        self.made = 0
        self.yields += 1
        await asyncio.sleep(0)


# Logs whose producer state a task is loading in steps, and that task (`producer_state_ready`).
_loads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def producer_state_ready(log) -> None:
    """Returns once `log`'s producer state is loaded and no rebuild of it is pending, at once if
    it is. A partition's first Produce, Fetch or transactional check after a start loads it:
    a snapshot, then every batch past it (a segment's worth when the newest snapshot is lost).
    The first step runs here (usually all of it: a snapshot at the log end); the rest, in steps
    of RELOAD_STEP_BATCHES batches with the loop turning between them, in one task that every
    request needing the state waits for, so they go on in the order they came (an idempotent
    producer's retry is checked against the whole state, as it would be after the load)."""
    if log.producer_state_ready:
        return
    loading = _loads.get(log)
    if loading is None:
        if not log.rebuild_step(load=True):
            return
        loading = _loads[log] = asyncio.ensure_future(_rest_in_steps(log))
        loading.add_done_callback(_retrieved)
    await asyncio.shield(loading)  # a waiter that goes away leaves it to the others


def load_producer_state_soon(log) -> None:
    """For the log cleaner, which cannot wait on the loop: `log`'s producer state is loaded in
    steps by a task (the one `producer_state_ready` runs, if under way); a failure is logged, and
    the next use of the state raises it again."""
    if not log.producer_state_ready and log not in _loads:
        asyncio.ensure_future(producer_state_ready(log)).add_done_callback(
            lambda task: _logged(task, log.directory.name))


def _logged(task: asyncio.Future, partition: str) -> None:
    error = None if task.cancelled() else task.exception()
    if error is not None:
        logger.warning("loading the producer state of %s failed: %s", partition, error)


async def _rest_in_steps(log) -> None:
    try:
        while log.rebuild_step():  # not `load`: a log deleted meanwhile is not loaded again
            await asyncio.sleep(0)
    finally:
        _loads.pop(log, None)


def _retrieved(task: asyncio.Future) -> None:
    """Its waiters raise its error; with none left, the next use of the state raises it again."""
    if not task.cancelled():
        task.exception()
