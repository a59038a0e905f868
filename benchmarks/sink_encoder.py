"""CPU per record of the Spark sink's encoder alone, in this process (issue 16): what `OwnProducer.send` does to
each Spark batch before its Produce requests (murmur2 of the keys, rows in partition order, record batches
encoded, CRCs), without a broker.

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/sink_encoder.py [--encoder numpy|numba]

Rows as `spark_workers.py`'s (key: the row number as a string; value: the row number padded to the size), in
Spark batches of 10,000 rows (spark.sql.execution.arrow.maxRecordsPerBatch), to 4 partitions; each round
encodes every batch once (fresh columns each round: Spark's come from the JVM). The encoder is numpy's (a
fresh worker's) or numba's (kernels.py: a worker's once numpy's has cost it numba's load; its load is not
counted); trees without the numba encoder have numpy's only.

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/sink_encoder.py --switch

instead measures a fresh worker's move to numba (compiled.py): the CPU of the send that moves, less a warm numba
send's, in a process that has imported what a Spark writer's worker has and nothing more (its columns built from
Arrow buffers, as the JVM's come: `pa.array` of Python objects would import pandas); run it once first to fill
numba's cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import pyarrow as pa

from ottla.spark import record_batches

try:
    from ottla.spark import compiled  # the one numba switch (2026-11-28 on)
except ImportError:
    compiled = None
from ottla.spark.producer import OwnProducer
from ottla.spark.record_batches import Columns

PARTITIONS = 4
ROWS_PER_SPARK_BATCH = 10_000


def spark_batches(n: int, size: int, start: int) -> list[Columns]:
    out = []
    for low in range(start, start + n, ROWS_PER_SPARK_BATCH):
        ids = range(low, min(start + n, low + ROWS_PER_SPARK_BATCH))
        out.append(Columns(pa.array([str(i).rjust(size, "x").encode() for i in ids], pa.binary()),
                           pa.array([str(i) for i in ids], pa.string())))
    return out


def producer() -> OwnProducer:
    """An own producer with no connection: its `send` encodes and hands its batches to nothing."""
    own = object.__new__(OwnProducer)
    own._leaders = {"t": [0] * PARTITIONS}
    own._sequences = defaultdict(int)
    own.producer_id, own.producer_epoch = 1, 0
    own._submit = lambda batches: None
    return own


def move() -> str:
    """A table row: the CPU of the send that moves this fresh process to numba, less a warm numba send's."""
    import numpy as np
    import pyspark.sql.worker.write_into_data_source  # noqa: F401  (a Spark writer's worker)

    def column(width: int) -> pa.Array:
        offsets = np.arange(0, (ROWS_PER_SPARK_BATCH + 1) * width, width, dtype=np.int32)
        data = np.arange(ROWS_PER_SPARK_BATCH * width, dtype=np.uint8)
        return pa.Array.from_buffers(pa.binary(), ROWS_PER_SPARK_BATCH, [None, pa.py_buffer(offsets),
                                                                         pa.py_buffer(data)])

    own, columns = producer(), Columns(column(100), column(7))
    compiled.COMPILED_AFTER_SECONDS = float("inf")
    own.send("t", columns)
    started = time.thread_time()
    own.send("t", columns)
    numpy_send = time.thread_time() - started
    compiled.COMPILED_AFTER_SECONDS = 0
    started = time.thread_time()
    own.send("t", columns)
    moving = time.thread_time() - started
    warm = []
    for _ in range(3):
        started = time.thread_time()
        own.send("t", columns)
        warm.append(time.thread_time() - started)
    return (f"| {moving - min(warm):.3f} | {numpy_send * 1e3:.1f} | {min(warm) * 1e3:.1f} | "
            f"{'pandas' in sys.modules} | {'pyarrow.compute' in sys.modules} | {os.getloadavg()[0]:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--encoder", choices=["numpy", "numba"], default="numba")
    parser.add_argument("--switch", action="store_true", help="measure the move to numba instead")
    args = parser.parse_args()
    if args.switch:
        print("| move s | numpy send ms | numba send ms | pandas imported | pyarrow.compute imported | load |\n"
              "| ---: | ---: | ---: | --- | --- | ---: |\n" + move())
        return 0
    has_numba = hasattr(record_batches, "encode_partitioned")
    if has_numba:
        switch = compiled if compiled is not None else record_batches  # trees before 2026-11-28: the encoder's own
        switch.COMPILED_AFTER_SECONDS = 0 if args.encoder == "numba" else float("inf")
    encoder = args.encoder if has_numba else "numpy (no numba encoder in this tree)"
    own = producer()
    load = os.getloadavg()[0]
    own.send("t", spark_batches(ROWS_PER_SPARK_BATCH, args.size, 0)[0])  # numba's load and first calls apart
    per_record = []
    for r in range(args.rounds):
        batches = spark_batches(args.rows, args.size, (r + 1) * args.rows)
        started = time.thread_time()
        for columns in batches:
            own.send("t", columns)
        per_record.append((time.thread_time() - started) / args.rows * 1e6)
    print("| encoder | rounds | min us/record | median us/record | load before / after |\n"
          "| --- | ---: | ---: | ---: | --- |\n"
          f"| {encoder} | {args.rounds} | {min(per_record):.3f} | {statistics.median(per_record):.3f} | "
          f"{load:.1f} / {os.getloadavg()[0]:.1f} |")
    print(f"- {args.rows:,} records of {args.size} bytes per round; command: python benchmarks/sink_encoder.py "
          f"{' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
