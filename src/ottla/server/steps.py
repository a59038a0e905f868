"""Requests naming thousands of partitions are handled in steps (issue 11, F3: no single
request may hold the event loop for long): 200,000 partitions in one Produce held it for 1.9 s
of CPU, in one OffsetForLeaderEpoch 0.9 s, in one Fetch 1.8 s."""

import asyncio

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
