"""How many turns the event loop gave others while a request was served: a handler that never
yields lets no other client in (issue 11, F3: no single request may hold the loop)."""

import asyncio


class OtherClients:
    """A task standing for the other clients, counting the turns it gets until `stop`."""

    def __init__(self):
        self.turns = 0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self):
        while True:
            self.turns += 1
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
