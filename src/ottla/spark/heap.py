"""The Python worker's long-lived heap, frozen out of the collections Spark runs after every task.

A module of its own so that a write task, which calls it first, imports nothing of the source with it.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_worker_heap"]

_FREEZE_AT_LEAST = 10_000  # objects in the collector's oldest generation


def freeze_worker_heap() -> None:
    """Called at the start of every task. Spark's worker daemon runs a full `gc.collect()` after every task
    (pyspark/daemon.py), which walks the whole heap of the Python worker: PySpark, pyarrow, numpy, pandas,
    45,000-80,000 objects, 20-50 ms of CPU per task here, more than a task of a few thousand records costs
    the connector. Nearly all of that heap lives as long as the worker (modules, classes, caches, kept
    clients), so whenever it has grown by `_FREEZE_AT_LEAST` objects the collector follows (the first task, and
    those that import more lazily), it moves to the collector's permanent generation (`gc.freeze()`): the
    collections after each task walk only what tasks create. Frozen objects are still freed when their
    last reference goes; only cyclic garbage frozen with them would stay, and there is none just after a
    collection."""
    if len(gc.get_objects(generation=2)) >= _FREEZE_AT_LEAST:
        gc.collect()
        gc.freeze()
