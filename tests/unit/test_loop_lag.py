"""The loop-hold attribution (server/loop_lag.py): a request's longest synchronous step is
recorded under its API name, and the wrapper is transparent to results, errors and cancellation."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from ottla.server import loop_lag


def test_the_longest_step_is_attributed_to_the_request(monkeypatch):
    monkeypatch.setattr(loop_lag, "longest_steps", {})

    async def handler():
        await asyncio.sleep(0)
        _spin(0.15)  # a step that holds the loop
        await asyncio.sleep(0.01)
        return "answer"

    assert asyncio.run(_await(loop_lag.timed(handler(), SimpleNamespace(what="Metadata v12")))) == "answer"
    assert loop_lag.longest_steps["Metadata v12"] >= 150  # the CPU the step spun for
    assert loop_lag.steps_summary().startswith("Metadata v12 ")


def test_errors_and_cancellation_pass_through(monkeypatch):
    monkeypatch.setattr(loop_lag, "longest_steps", {})
    seen = []

    async def failing():
        await asyncio.sleep(0)
        raise ValueError("bad request")

    async def waiting():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    async def scenario():
        with pytest.raises(ValueError, match="bad request"):
            await loop_lag.timed(failing(), SimpleNamespace(what="Produce v9"))
        task = asyncio.ensure_future(_await(loop_lag.timed(waiting(), SimpleNamespace(what="Fetch v12"))))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert seen == ["cancelled inside"]
    assert set(loop_lag.longest_steps) == {"Produce v9", "Fetch v12"}


async def _await(awaitable):
    return await awaitable


def _spin(seconds: float) -> None:
    """Hold the thread with work (CPU time), as a slow handler does."""
    cpu_started = time.thread_time()
    while time.thread_time() - cpu_started < seconds:
        pass


def test_a_collection_inside_a_step_is_not_charged_to_the_request(monkeypatch):
    import gc

    monkeypatch.setattr(loop_lag, "longest_steps", {})
    pauses = loop_lag.GcPauses()
    gc.callbacks.append(pauses)
    garbage = [[[] for _ in range(50)] for _ in range(20000)]  # objects a full collection must walk

    async def handler():
        await asyncio.sleep(0)
        gc.collect()  # the collector runs inside this step, as it does inside whatever allocates
        return len(garbage)

    collected_before = loop_lag._loop_gc_cpu[0]
    try:
        asyncio.run(_await(loop_lag.timed(handler(), SimpleNamespace(what="ApiVersions v0"))))
    finally:
        gc.callbacks.remove(pauses)
    collection_ms = (loop_lag._loop_gc_cpu[0] - collected_before) * 1000
    assert collection_ms > 10  # a million objects walked
    assert loop_lag.longest_steps["ApiVersions v0"] < collection_ms / 2



def test_the_selector_times_each_iteration_of_the_loop(caplog):
    """The hold probe is told by the loop's selector when an iteration begins and ends (it has no
    timer of its own): a callback that holds the loop is its worst lag and its worst CPU, each
    logged as the worst so far."""
    from ottla.server.event_loop import new_event_loop

    lag = loop_lag.LoopLag()
    loop = new_event_loop(probe=lag)
    try:
        loop.call_soon(_spin, 0.05)  # before `start`: not measured (a broker's start-up)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert lag.worst_ms == 0
        lag.start()
        with caplog.at_level("INFO", logger="ottla.loop"):
            loop.call_soon(_spin, 0.15)
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert lag.worst_ms >= 150 and lag.worst_cpu_ms >= 150
    assert "event loop lag" in caplog.text and "ms of CPU between two wake-ups" in caplog.text
