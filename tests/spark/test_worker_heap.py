"""The Python worker's long-lived heap is frozen, so Spark's gc.collect() after every task skips it, and
the collector still frees the cycles tasks leave."""

from __future__ import annotations

import gc
import weakref

from ottla.spark.heap import freeze_worker_heap


class _Node:
    pass


def test_a_grown_heap_is_frozen_and_new_cycles_are_still_collected():
    # A grown heap of its own: earlier tests in the same process may have frozen pytest's (a broker
    # run in-process freezes its start-up objects), leaving generation 2 nearly empty.
    grown = [_Node() for _ in range(10_000)]
    gc.collect()
    assert len(gc.get_objects(generation=2)) >= 10_000
    frozen = gc.get_freeze_count()
    try:
        freeze_worker_heap()
        assert gc.get_freeze_count() > frozen
        assert len(gc.get_objects(generation=2)) < 10_000
        # Nothing grew: nothing more to freeze. (The freeze count itself may drop meanwhile: frozen
        # objects are still freed when their last reference goes.)
        freezes = []
        real_freeze = gc.freeze
        gc.freeze = lambda: (freezes.append(1), real_freeze())[1]
        try:
            freeze_worker_heap()
        finally:
            gc.freeze = real_freeze
        assert freezes == []

        cycle = _Node()
        cycle.self = cycle
        alive = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()
        del grown
