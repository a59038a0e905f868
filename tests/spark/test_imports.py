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
