"""What importing the connector costs a Spark Python process that only reads.

Spark starts the driver's streaming source process (`python_streaming_source_runner`) afresh for every
streaming query, and it imports `ottla.spark` to unpickle the data source: whatever the package imports
at the top is paid again by every query start.
"""

from __future__ import annotations

import os
import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    return set(result.stdout.split())


def test_the_package_imports_the_sink_only_when_something_is_written():
    loaded = _modules_after("import ottla.spark")
    assert "ottla.spark.source" in loaded
    assert not {"ottla.spark.sink", "ottla.spark.producer", "kio"} & loaded


# A Fetch answer of 2,000 100-byte records in one batch, about 230 KB: over the 128 KiB from which the
# source loaded numba until 2026-11-27.
_LARGE_ANSWER = ("from ottla.records.records import Record, build_batch; "
                 "from ottla.spark import columns; "
                 "answer = build_batch([Record(b'k', bytes(100), (), 1)] * 2000)")


def test_a_fresh_worker_decodes_its_first_large_answers_without_numba():
    # numba's load costs a fresh Spark Python worker 0.4-0.5 s of CPU, more than it saves on a short job's
    # records (docs/performance.md, Spark section).
    loaded = _modules_after(f"{_LARGE_ANSWER}; assert len(columns.decode_record_set(answer, 0, 2000, None)) == 2000")
    assert "numba" not in loaded


def test_a_worker_moves_to_numba_once_it_has_decoded_enough_records():
    statement = (f"{_LARGE_ANSWER}; columns.COMPILED_AFTER_RECORDS = 3000; "
                 "[columns.decode_record_set(answer, 0, 2000, None) for _ in range(2)]; "
                 "assert 'numba' not in sys.modules; "
                 "assert len(columns.decode_record_set(answer, 0, 2000, None)) == 2000")
    assert "numba" in _modules_after(statement)
