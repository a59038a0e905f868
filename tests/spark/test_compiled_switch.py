"""The one move to numba per Spark Python worker (spark/compiled.py): its load makes every loop's first call at
once, with the argument types the decoder and the encoder pass (a first call with a new type compiles: 2.5-3 s of
CPU in the middle of a task, or a disk-cache load), and one process at a time loads while the others keep their
numpy paths (with an empty cache, a fresh install's, every worker crossing the threshold compiled the loops at
once: 2.7 s of CPU each, docs/performance.md, Spark section, 2026-11-28)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from ottla.spark import compiled


def _run(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=300)
    return set(result.stdout.split())


_ENCODE = ("import numpy as np, pyarrow as pa; from ottla.spark import compiled, record_batches as rb; "
           "columns = rb.Columns(pa.array([bytes(100)] * 2000), pa.array([str(i) for i in range(2000)])); "
           "encode = lambda: rb.encode_partitioned(columns, np.full(2000, -1), 4, 0, {p: 0 for p in range(4)}, "
           "max_bytes=100_000, timestamp=0); compiled.COMPILED_AFTER_SECONDS = 1e-9; "
           "rb._KERNEL_SECONDS_PER_RECORD = 0")

# After the switch, decode and encode what a worker meets (compressed or not, with headers or without, keys as
# strings or none, large binary values, partitions given or by key): no loop may gain a signature.
_NO_NEW_SIGNATURE = """
import numpy as np, pyarrow as pa
from ottla.records.records import Record, build_batch
from ottla.spark import compiled, columns as cm, record_batches as rb
compiled.COMPILED_AFTER_SECONDS = 0
kernels = compiled.kernels()
names = ["scan_batches", "walk_records", "walk_headers", "partitions_of", "partition_order", "lay_out"]
loaded = {name: list(getattr(kernels, name).signatures) for name in names}
headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
records = [Record(b"k%d" % i, bytes(i), (("h", b"x"),) * (i % 3), i) for i in range(50)]
for codec in ("uncompressed", "gzip", "lz4"):
    answer = build_batch(records, compression=codec) + build_batch(records, base_offset=50)
    for headers in (None, headers_type):
        assert len(cm.decode_record_set(answer, 3, 90, None, headers)) == 87
        assert len(cm.decode_record_set(memoryview(answer), 0, 100, [], headers)) == 100
headers = pa.array([[{"key": "h", "value": b"v"}]] * 10, headers_type)
for keys in (None, pa.array([str(i) for i in range(10)]), pa.array([b"k"] * 10)):
    for values in (pa.array([b"v"] * 10), pa.array([b"v"] * 10, pa.large_binary()), pa.array(["v"] * 10)):
        for row_headers in (None, headers):
            columns = rb.Columns(values, keys, row_headers)
            for partitions in (np.full(10, -1), np.arange(10) % 3, np.arange(10, dtype=np.int32) % 3):
                rb.encode_partitioned(columns, partitions, 3, 0, {p: 0 for p in range(3)}, max_bytes=100, timestamp=0)
            rb.encode_partitioned(columns.take(np.arange(9, -1, -1)), np.full(10, -1), 3, 0, {p: 0 for p in range(3)},
                                  max_bytes=1 << 20, timestamp=0)
assert {name: list(getattr(kernels, name).signatures) for name in names} == loaded, "a loop compiled again"
"""


def test_the_switch_makes_every_loops_first_call_with_the_types_the_paths_pass():
    assert "ottla.spark.kernels" in _run(_NO_NEW_SIGNATURE)


def test_a_worker_keeps_its_numpy_paths_while_another_loads_the_kernels():
    with open(compiled.lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        loaded = _run(f"{_ENCODE}; encode(); encode(); assert compiled.kernels() is None")
        assert "numba" not in loaded
    # The lock released: the same statement moves over.
    assert "ottla.spark.kernels" in _run(f"{_ENCODE}; encode(); encode(); assert compiled.kernels() is not None")
