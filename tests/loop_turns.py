"""How many turns the event loop gave others while a request was served: a handler that never
yields lets no other client in (issue 11, F3: no single request may hold the loop)."""

import asyncio
import gc


class OtherClients:
    """A task standing for the other clients, counting the turns it gets until `stop`; with
    `look`, what it returns at each turn is kept in `seen`."""

    def __init__(self, look=None):
        self.turns = 0
        self.seen = []
        self._look = look
        self._task = asyncio.ensure_future(self._run())

    async def _run(self):
        while True:
            self.turns += 1
            if self._look is not None:
                self.seen.append(self._look())
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


async def with_turns(work) -> tuple[int, object]:
    """`work`'s result, and how many turns the other clients got while it ran."""
    others = OtherClients()
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        others.stop()
    return others.turns, result


async def seen_between_turns(work, look) -> tuple[list, object]:
    """`work`'s result, and what `look()` returned at each turn the other clients got meanwhile,
    then once more as it ended (so that its last step is seen too). The cyclic collector is
    paused meanwhile: a collection of earlier tests' garbage landing in a step would be counted
    as that step's work (8,883 blocks freed in one step, seen in the full unit suite)."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    others = OtherClients(look)
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        others.stop()
        if collecting:
            gc.enable()
    return others.seen + [look()], result


def most_objects_between_turns(seen_blocks: list[int]) -> int:
    """The most memory blocks made or freed between two turns (`sys.getallocatedblocks` looked
    at each turn): how much one step did, counted in objects rather than time."""
    return max((abs(b - a) for a, b in zip(seen_blocks, seen_blocks[1:])), default=0)

