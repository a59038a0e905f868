"""The one decision per process to move from the numpy paths (walk.py for the source's decoder, numpy's encoder
in record_batches.py for the sink's) to numba's loops (kernels.py): the rent-or-buy rule, counted once.

numba's import and its first calls cost a Spark Python worker 0.45-0.6 s of CPU (docs/performance.md, Spark
section), whether the worker then decodes, encodes or both. So both paths charge the CPU they took over the
kernels' estimate to one account and, once it reaches `COMPILED_AFTER_SECONDS`, both use the kernels: a worker
pays numba's load once, at most about twice what the numpy paths lost, instead of once per path at two moments.

The load makes every loop's first call at once (`warm_up`: the modules' own calls, with the argument types they
pass), holding a lock that one process of the machine's user has at a time: with an empty disk cache (a fresh
install) the first process to switch compiles the loops (2.5-3 s of CPU each time) while the others keep their
numpy paths, then loads them from the cache, instead of every worker that crosses the threshold compiling them.
"""

from __future__ import annotations

import importlib
import os

COMPILED_AFTER_SECONDS = 0.5  # numba's load in a worker, CPU seconds (in-process, 2026-11-27)
_over_kernels = 0.0  # CPU seconds the numpy paths took in this process over the kernels' estimates
_kernels = None  # kernels.py once loaded and warmed up in this process
_warm_ups: list = []  # each importing module's first calls of its loops, given kernels.py


def kernels():
    """kernels.py once the numpy paths have cost this process its load, else None (also while another process
    holds the load's lock)."""
    global _kernels
    if _over_kernels < COMPILED_AFTER_SECONDS:
        return None
    if _kernels is None:
        _kernels = _load()
    return _kernels


def charge(seconds: float) -> None:
    """Count CPU seconds a numpy path took over what the kernels would have (negative: under)."""
    global _over_kernels
    _over_kernels += seconds


def warm_up(first_calls) -> None:
    """Register a module's first calls of its loops (`first_calls(kernels)`), made when the process loads them."""
    _warm_ups.append(first_calls)
    if _kernels is not None:
        first_calls(_kernels)


def load():
    """kernels.py loaded now, waiting for another process's load if need be: for callers that choose the kernels
    themselves (tests, benchmarks) with `COMPILED_AFTER_SECONDS` at 0."""
    global _kernels
    if _kernels is None:
        _kernels = _load(wait=True)
    return _kernels


def lock_path() -> str:
    """The load's lock: one per user and installed kernels.py."""
    import tempfile
    import zlib

    where = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.py")
    return os.path.join(tempfile.gettempdir(), f"ottla-kernels-{os.getuid()}-{zlib.crc32(where.encode()):08x}.lock")


def _load(wait: bool = False):
    """kernels.py with every registered first call made, or None if another process is loading it (unless `wait`)."""
    import fcntl

    with open(lock_path(), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        module = importlib.import_module(f"{__package__}.kernels")
        for first_calls in _warm_ups:
            first_calls(module)
        return module  # the lock goes with the file's close
