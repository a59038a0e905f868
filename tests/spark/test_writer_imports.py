"""What a write task's Python worker imports: only what writing needs.

Spark runs a write task in a Python worker that unpickles the writer (`ottla.spark.sink`) and calls
`write`; a fresh worker pays for every module that brings in, in each task it starts with (docs/performance.md,
Spark section: the cold sink). Ottla's own producer writes the rows: the source's modules and confluent-kafka
(the librdkafka path, `rdkafka.py`; its admin client on the driver) have no part in it, nor the
transactional producer in an at-least-once task.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.serializers import CloudPickleSerializer
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import BinaryType, StructType

from ottla.spark import OttlaDataSource, OptionError

# Imported only to read, or only on the librdkafka path; and pyarrow.compute, whose Python wrappers of every
# Arrow compute function a Spark worker has not loaded (record_batches calls the few it needs by name).
_NOT_IN_A_WRITER = {"ottla.spark.source", "ottla.spark.fetch", "ottla.spark.columns", "ottla.spark.kernels",
                    "ottla.spark.rdkafka", "ottla.end_offsets", "confluent_kafka", "pyarrow.compute"}

# A write task as Spark's worker runs it: the writer unpickled, then `write` over the task's Arrow batches, read
# from an Arrow stream as the worker reads them from the JVM.
_TASK = """
import sys
import pyarrow.ipc
import pyspark.sql.worker.write_into_data_source
from pyspark import TaskContext
from pyspark.serializers import CPickleSerializer

class Context:
    def partitionId(self):
        return 0

    def getLocalProperty(self, key):
        return {{"streaming.sql.batchId": "0", "sql.streaming.queryId": "q1"}}[key]

TaskContext.get = staticmethod(Context)
writer = CPickleSerializer().loads(bytes.fromhex({pickled!r}))
result = writer.write(iter(pyarrow.ipc.open_stream(bytes.fromhex({rows!r}))))
assert result.records == 3, result
print(" ".join(sys.modules))
"""


def _modules_of_a_task(writer) -> set[str]:
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    code = _TASK.format(pickled=CloudPickleSerializer().dumps(writer).hex(), rows=sink.getvalue().to_pybytes().hex())
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    return set(result.stdout.split())


def _not_for_writing(loaded: set[str]) -> set[str]:
    return {name for name in loaded
            if name in _NOT_IN_A_WRITER or name.split(".")[0] in _NOT_IN_A_WRITER - {"pyarrow"}}


def _source(kafka, topic: str) -> OttlaDataSource:
    kafka.create_topic(topic)
    return OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic}))


SCHEMA = StructType().add("value", BinaryType())


def test_an_at_least_once_write_task_imports_only_the_own_producer(kafka):
    loaded = _modules_of_a_task(_source(kafka, "writer-imports").writer(SCHEMA, overwrite=False))
    assert "ottla.spark.producer" in loaded
    assert _not_for_writing(loaded) == set()
    assert "ottla.spark.transactional" not in loaded


def test_an_exactly_once_write_task_imports_no_reading_or_librdkafka_module(kafka):
    loaded = _modules_of_a_task(_source(kafka, "writer-imports-eos").streamWriter(SCHEMA, overwrite=False))
    assert "ottla.spark.transactional" in loaded
    assert _not_for_writing(loaded) == set()


# The driver's planning of a write (Spark's Python planner process: `writer` or `streamWriter`, pickled to the
# tasks), with its modules. librdkafka's admin client took 55-60 ms to start and answer there before every write
# job; the own producer's protocol client, imported with the sink anyway, asks Metadata directly.
_PLAN = """
import sys
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import BinaryType, StructType
from ottla.spark import OttlaDataSource

options = CaseInsensitiveDict({{"kafka.bootstrap.servers": {bootstrap!r}, "topic": {topic!r}}})
OttlaDataSource(options).{method}(StructType().add("value", BinaryType()), overwrite=False)
print(" ".join(sys.modules))
"""


def _modules_of_planning(kafka, topic: str, method: str) -> set[str]:
    code = _PLAN.format(bootstrap=kafka.bootstrap, topic=topic, method=method)
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    return set(result.stdout.split())


def test_the_driver_looks_for_the_topic_without_librdkafka(kafka):
    kafka.create_topic("planned-write")
    for method in ("writer", "streamWriter"):
        loaded = _modules_of_planning(kafka, "planned-write", method)
        assert "ottla.spark.sink" in loaded
        assert not any(name.split(".")[0] == "confluent_kafka" for name in loaded), method


def test_a_write_to_an_unknown_topic_fails_when_planned(kafka):
    kafka.create_topic("known-topic")
    source = OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap,
                                                  "topic": "no-such-topic"}))
    with pytest.raises(OptionError, match=r"unknown topic\(s\) \['no-such-topic'\]"):
        source.writer(SCHEMA, overwrite=False)
    marked = OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap, "topic": "known-topic",
                                                  "markerTopic": "no-such-marker"}))
    with pytest.raises(OptionError, match=r"unknown topic\(s\) \['no-such-marker'\]"):
        marked.streamWriter(SCHEMA, overwrite=False)
    marked_known = OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap,
                                                        "topic": "known-topic", "markerTopic": "known-topic"}))
    assert marked_known.streamWriter(SCHEMA, overwrite=False) is not None
