"""The one decision per process to move from the numpy paths (walk.py for the source's decoder, numpy's encoder
in record_batches.py for the sink's) to numba's loops (kernels.py): the rent-or-buy rule, counted once.

numba's import and its first calls cost a Spark Python worker 0.45-0.6 s of CPU (docs/performance.md, Spark
section), whether the worker then decodes, encodes or both. So both paths charge the CPU they took over the
kernels' estimate to one account and, once it reaches `COMPILED_AFTER_SECONDS`, both use the kernels: a worker
pays numba's load once, at most about twice what the numpy paths lost, instead of once per path at two moments.
"""

from __future__ import annotations

import importlib

COMPILED_AFTER_SECONDS = 0.5  # numba's load in a worker, CPU seconds (in-process, 2026-11-27)
_over_kernels = 0.0  # CPU seconds the numpy paths took in this process over the kernels' estimates


def kernels():
    """kernels.py once the numpy paths have cost this process its load (imported then), else None."""
    if _over_kernels >= COMPILED_AFTER_SECONDS:
        return importlib.import_module(f"{__package__}.kernels")
    return None


def charge(seconds: float) -> None:
    """Count CPU seconds a numpy path took over what the kernels would have (negative: under)."""
    global _over_kernels
    _over_kernels += seconds
