"""What importing the connector costs a Spark Python process that only reads.

Spark starts the driver's streaming source process (`python_streaming_source_runner`) afresh for every
streaming query, and it imports `ottla.spark` to unpickle the data source: whatever the package imports
at the top, and whatever the source's driver calls import, is paid again by every query start. The
driver needs confluent-kafka's admin client and the source's planning; the executors' reading (Fetch
client, kio, the numba kernels) and the sink (producer, transactions) are imported where they run.
"""

from __future__ import annotations

import os
import subprocess
import sys

# What only executors or writes need; each is 0.1-0.5 s of CPU in a fresh interpreter (kio with
# hypothesis installed, numba), or pulls one of those in.
_NOT_ON_THE_DRIVER = {
    "ottla.spark.sink", "ottla.spark.producer", "ottla.spark.transactional", "ottla.spark.fetch",
    "ottla.spark.columns", "ottla.spark.kernels", "ottla.spark.record_batches", "ottla.admin_client",
    "ottla.protocol", "ottla.records", "ottla.server", "kio", "numba", "hypothesis",
}

# The runner's own part: unpickle the data source, then one micro-batch's calls, as the runner makes them.
_RUNNER = """
import pyspark.sql.streaming.python_streaming_source_runner
from pyspark.serializers import CPickleSerializer
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable
source = CPickleSerializer().loads(bytes.fromhex({pickled!r}))
reader = _streamReader(source, source.schema())
start = reader.initialOffset()
reader.prepareForTriggerAvailableNow()
end = reader.latestOffset(start, ReadAllAvailable())
assert reader.partitions(start, end)
reader.commit(end)
reader.stop()
"""


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    return set(result.stdout.split())


def _heavy(loaded: set[str]) -> set[str]:
    return {name for name in loaded if name in _NOT_ON_THE_DRIVER or name.split(".")[0] in _NOT_ON_THE_DRIVER
            or ".".join(name.split(".")[:2]) in _NOT_ON_THE_DRIVER}


def test_the_package_imports_the_sink_only_when_something_is_written():
    loaded = _modules_after("import ottla.spark")
    assert "ottla.spark.options" in loaded
    # Nor the source until something is read: a write task's worker unpickles its writer from this package.
    assert not {"ottla.spark.sink", "ottla.spark.producer", "kio", "ottla.spark.source"} & loaded


def test_the_driver_streaming_source_process_imports_no_executor_or_sink_module(kafka):
    from confluent_kafka import Producer
    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.datasource import CaseInsensitiveDict

    from ottla.spark import OttlaDataSource

    kafka.create_topic("runner-imports")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        producer.produce("runner-imports", b"%d" % i)
    assert producer.flush(60) == 0
    source = OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap,
                                                  "subscribe": "runner-imports", "startingOffsets": "earliest"}))
    loaded = _modules_after(_RUNNER.format(pickled=CloudPickleSerializer().dumps(source).hex()))
    assert "ottla.spark.source" in loaded
    assert _heavy(loaded) == set()


# A Fetch answer of 2,000 100-byte records in one batch, about 230 KB: over the 128 KiB from which the
# source loaded numba until 2026-11-27.
_LARGE_ANSWER = ("from ottla.records.records import Record, build_batch; "
                 "from ottla.spark import columns, compiled; "
                 "answer = build_batch([Record(b'k', bytes(100), (), 1)] * 2000)")


def test_a_fresh_worker_decodes_its_first_large_answers_without_numba():
    # numba's load costs a fresh Spark Python worker 0.4-0.5 s of CPU, more than it saves on a short job's
    # records (docs/performance.md, Spark section).
    loaded = _modules_after(f"{_LARGE_ANSWER}; assert len(columns.decode_record_set(answer, 0, 2000, None)) == 2000")
    assert "numba" not in loaded


def test_a_worker_moves_to_numba_once_walk_py_has_cost_it_enough():
    # Any CPU time walk.py takes counts (the kernels' estimate set to nothing): a nanosecond is enough.
    statement = (f"{_LARGE_ANSWER}; compiled.COMPILED_AFTER_SECONDS = 1e-9; columns._KERNEL_SECONDS_PER_RECORD = 0; "
                 "columns.decode_record_set(answer, 0, 2000, None); "
                 "assert 'numba' not in sys.modules; "
                 "assert len(columns.decode_record_set(answer, 0, 2000, None)) == 2000")
    assert "numba" in _modules_after(statement)
