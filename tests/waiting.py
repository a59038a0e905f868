"""Polling for a condition in process-level tests: brokers and ZooKeeper change state on
their own time, so a test waits for what it expects, with a deadline and a clear message."""

import time


def wait_for(predicate, timeout: float = 90.0, what: str = "condition", interval: float = 0.2):
    """Return `predicate()`'s first truthy value; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


async def coordinators_loaded(broker, timeout: float = 60.0) -> None:
    """Wait until the broker's group and transaction coordinators have loaded every partition
    they lead: both load in steps on the event loop, answering COORDINATOR_LOAD_IN_PROGRESS
    meanwhile, as Kafka does."""
    import asyncio

    from ottla.errors import ErrorCode

    deadline = time.monotonic() + timeout
    while (broker.groups.coordinator.list_groups().error == ErrorCode.coordinator_load_in_progress
           or broker.transactions.coordinator.list_transactions(0).error == ErrorCode.coordinator_load_in_progress):
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the coordinators to load")
        await asyncio.sleep(0.01)
