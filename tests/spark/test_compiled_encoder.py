"""The sink's two encoders (spark/record_batches.py: numpy's for a fresh worker, numba's in kernels.py once
numpy's has cost it numba's load) write the same bytes: same partitions, same batches, same CRCs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ottla.spark import kernels
from ottla.spark.record_batches import Columns, _compiled_sets, _numpy_sets

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# Keys null, empty, short (a head holds them: up to 16 bytes, read 8 at a time by numpy's encoder) and long
# (joined as a piece of their own by numpy's encoder).
key = st.none() | st.binary(max_size=3) | st.binary(min_size=4, max_size=16) | st.binary(min_size=17, max_size=200)
value = st.none() | st.binary(max_size=300)
header = st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=20))
row = st.tuples(key, value, st.none() | st.lists(header, max_size=3), st.integers(-1, 7))


def _columns(rows: list, with_headers: bool, large: bool) -> Columns:
    kind = pa.large_binary() if large else pa.binary()
    headers = pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for _, _, h, _ in rows],
                       HEADERS)
    return Columns(pa.array([v for _, v, _, _ in rows], kind), pa.array([k for k, _, _, _ in rows], pa.binary()),
                   headers if with_headers else None)


def _encoded(sets) -> tuple[list, list]:
    partitions, encoded = sets
    return partitions.tolist(), [(p, [(bytes(b.data), b.records) for b in batches]) for p, batches in encoded]


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(row, max_size=60), count=st.integers(1, 8), max_bytes=st.sampled_from([200, 700, 1_000_000]),
       with_headers=st.booleans(), large=st.booleans(), no_keys=st.booleans(), offset=st.integers(0, 3),
       sequence=st.sampled_from([-1, 0, 2**31 - 5]))
def test_numbas_encoder_writes_numpys_bytes(rows, count, max_bytes, with_headers, large, no_keys, offset, sequence):
    columns = _columns(rows, with_headers, large)
    if no_keys:
        columns = Columns(columns.values, None, columns.headers)
    columns = columns.slice(min(offset, len(rows)), len(rows))  # Arrow arrays that start past their buffers' 0
    partitions = np.array([min(p, count - 1) for _, _, _, p in rows][min(offset, len(rows)):], np.int64)
    sequences = {p: -1 if sequence < 0 else sequence + 10 * p for p in range(count)}
    header = dict(timestamp=1_700_000_000_000, producer_id=7 if sequence >= 0 else -1,
                  producer_epoch=2 if sequence >= 0 else -1, transactional=sequence >= 0)
    expected = _encoded(_numpy_sets(columns, partitions, count, 1 % count, sequences, max_bytes, header))
    got = _encoded(_compiled_sets(kernels, columns, partitions, count, 1 % count, sequences, max_bytes, header))
    assert got == expected


# 2,000 rows to 4 partitions by key, encoded by `encode_partitioned` as the own producer calls it; `bytes` their
# batches' bytes, for comparing the two encoders' output.
_ENCODE = ("import numpy as np, pyarrow as pa; from ottla.spark import compiled, record_batches as rb; "
           "columns = rb.Columns(pa.array([bytes(100)] * 2000), pa.array([str(i) for i in range(2000)])); "
           "encode = lambda: [bytes(b.data) for _, bs in rb.encode_partitioned(columns, np.full(2000, -1), 4, 0, "
           "{p: 0 for p in range(4)}, max_bytes=100_000, timestamp=0)[1] for b in bs]")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=300)
    return set(result.stdout.split())


def test_a_fresh_worker_encodes_its_first_writes_without_numba():
    # numba's load costs a fresh Spark Python worker 0.4-0.5 s of CPU (docs/performance.md, Spark section).
    assert "numba" not in _modules_after(f"{_ENCODE}; encode(); encode()")


def test_a_worker_moves_to_numba_once_numpys_encoder_has_cost_it_enough():
    # Any CPU time numpy's encoder takes counts (the kernels' estimate set to nothing): a nanosecond is enough.
    statement = (f"{_ENCODE}; compiled.COMPILED_AFTER_SECONDS = 1e-9; rb._KERNEL_SECONDS_PER_RECORD = 0; "
                 "first = encode(); assert 'numba' not in sys.modules; assert encode() == first")
    assert "ottla.spark.kernels" in _modules_after(statement)


# As a Spark worker's columns come (Arrow buffers, not Python objects: `pa.array` of those imports pandas).
_ENCODE_BUFFERS = ("import numpy as np, pyarrow as pa; from ottla.spark import compiled, record_batches as rb; "
                   "array = lambda width: pa.Array.from_buffers(pa.binary(), 2000, [None, pa.py_buffer(np.arange("
                   "0, 2001 * width, width, dtype=np.int32)), pa.py_buffer(bytes(range(256)) * (8 * width))]); "
                   "entries = pa.StructArray.from_arrays([array(2).view(pa.string()), array(3)], ['key', 'value']); "
                   "columns = rb.Columns(array(100), array(6), pa.ListArray.from_arrays(pa.Array.from_buffers("
                   "pa.int32(), 2001, [None, pa.py_buffer(np.arange(2001, dtype=np.int32))]), entries)); "
                   "encode = lambda: [bytes(b.data) for _, bs in rb.encode_partitioned(columns, np.full(2000, -1), 4, "
                   "0, {p: 0 for p in range(4)}, max_bytes=100_000, timestamp=0)[1] for b in bs]")


def test_the_move_to_numba_imports_no_pandas():
    # A Spark writer's worker has not imported pandas nor pyarrow.compute (tests/spark/test_writer_imports.py); until
    # 2026-11-28 the move's first calls built their columns with `pa.array`, which imported pandas (0.3-0.4 s more
    # CPU per move), and headers were flattened with `ListArray.flatten`, which imports pyarrow.compute (0.1 s).
    statement = (f"{_ENCODE_BUFFERS}; compiled.COMPILED_AFTER_SECONDS = 1e-9; rb._KERNEL_SECONDS_PER_RECORD = 0; "
                 "first = encode(); second = encode(); from ottla.spark import kernels; "
                 "assert kernels.lay_out.signatures, 'still on numpy'; assert first == second")
    modules = _modules_after(statement)
    assert "ottla.spark.kernels" in modules
    assert "pandas" not in modules
    assert "pyarrow.compute" not in modules


def test_a_source_worker_decoding_headers_and_moving_to_numba_imports_no_pandas():
    # columns._headers built the list offsets with `pa.array`, which imported pandas: in a fresh source worker's
    # first read of headers, and again in the move's first calls (columns._first_calls decodes headers).
    statement = ("import numpy as np, pyarrow as pa; from ottla.records.records import Record, build_batch; "
                 "from ottla.spark import compiled, columns as cm; "
                 "kind = pa.list_(pa.struct([('key', pa.string()), ('value', pa.binary())])); "
                 "answer = build_batch([Record(b'k', bytes(100), (('h', b'v'),), 1)] * 2000); "
                 "decode = lambda: cm.decode_record_set(answer, 0, 2000, None, kind).headers; "
                 "first = decode(); assert 'pandas' not in sys.modules, 'the first read'; "
                 "compiled.COMPILED_AFTER_SECONDS = 1e-9; cm._KERNEL_SECONDS_PER_RECORD = 0; decode(); "
                 "from ottla.spark import kernels; assert decode().equals(first); "
                 "assert kernels.walk_headers.signatures, 'decoded with walk.py'")
    modules = _modules_after(statement)
    assert "ottla.spark.kernels" in modules
    assert "pandas" not in modules


# One switch per worker (spark/compiled.py): numba's load is paid once, so whichever path paid it, the other uses
# the kernels from then on. Until 2026-11-28 each path had its own account: a worker whose encoder had moved to
# numba kept decoding with walk.py until walk.py had cost it another 0.5 s (and then paid the kernels' first calls
# at another moment), and a worker that had decoded with kernels encoded with them only because it imported them.
_LARGE_ANSWER = ("from ottla.records.records import Record, build_batch; from ottla.spark import columns as cm; "
                 "answer = build_batch([Record(b'k', bytes(100), (), 1)] * 2000); "
                 "decode = lambda: len(cm.decode_record_set(answer, 0, 2000, None))")


def test_a_worker_whose_encoder_moved_to_numba_decodes_with_it_at_once():
    statement = (f"{_ENCODE}; {_LARGE_ANSWER}; compiled.COMPILED_AFTER_SECONDS = 1e-9; "
                 "rb._KERNEL_SECONDS_PER_RECORD = 0; encode(); encode(); from ottla.spark import kernels; "
                 "assert decode() == 2000; assert kernels.walk_records.signatures, 'decoded with walk.py'")
    assert "ottla.spark.kernels" in _modules_after(statement)


def test_a_worker_whose_decoder_moved_to_numba_encodes_with_it_at_once():
    statement = (f"{_ENCODE}; {_LARGE_ANSWER}; compiled.COMPILED_AFTER_SECONDS = 1e-9; "
                 "cm._KERNEL_SECONDS_PER_RECORD = 0; decode(); decode(); from ottla.spark import kernels; "
                 "encode(); assert kernels.lay_out.signatures, 'encoded with numpy'")
    assert "ottla.spark.kernels" in _modules_after(statement)


def test_the_decoder_and_the_encoder_charge_one_account():
    # Half the price each (what they took over the kernels, as measured): together they pay for numba's load.
    statement = (f"{_ENCODE}; {_LARGE_ANSWER}; compiled.COMPILED_AFTER_SECONDS = float('inf'); "
                 "rb._KERNEL_SECONDS_PER_RECORD = cm._KERNEL_SECONDS_PER_RECORD = 0; "
                 "decode(); decoded = compiled._over_kernels; encode(); encoded = compiled._over_kernels - decoded; "
                 "assert decoded > 0 and encoded > 0; "
                 "compiled.COMPILED_AFTER_SECONDS = decoded + encoded; assert compiled.kernels() is not None")
    assert "ottla.spark.kernels" in _modules_after(statement)
