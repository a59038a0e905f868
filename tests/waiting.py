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
