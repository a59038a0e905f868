"""The `ottla` Spark data source against a Kafka-protocol cluster, with real local Spark."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter

import pytest

pytestmark = pytest.mark.spark


from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pyspark import TaskContext
from pyspark.cloudpickle import register_pickle_by_value
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql.datasource import CaseInsensitiveDict, DataSourceStreamArrowWriter
from pyspark.sql.functions import col, lit
from py4j.protocol import Py4JJavaError

from ottla.spark import OttlaDataSource

# Spark's Python workers cannot import this test module: ship its classes by value.
register_pickle_by_value(sys.modules[__name__])


def topic(kafka, prefix: str) -> tuple[str, int]:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return name, kafka.create_topic(name)


def produce(kafka, name: str, partitions: int, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i, value in enumerate(values):
        producer.produce(name, value.encode(), f"k{i}".encode(), partition=i % partitions,
                         headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0


def consume_committed(kafka, name: str, partitions: int) -> list[str]:
    """Everything a read_committed consumer sees in the topic, read to the end of every partition."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "checker", "enable.partition.eof": True,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(name, p, 0) for p in range(partitions)])
    values, at_end = [], set()
    deadline = time.monotonic() + 60
    while len(at_end) < partitions and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
                continue
            raise RuntimeError(msg.error())
        values.append(msg.value().decode())
    consumer.close()
    assert len(at_end) == partitions, f"could not read {name} to its end"
    return values


def with_bootstrap(kafka, **options) -> dict:
    return {"kafka.bootstrap.servers": kafka.bootstrap, **options}


# --- bad options fail before any task runs -------------------------------------------------------------


def _failure(action) -> str:
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        action()
    return str(caught.value)


def test_bad_options_fail_at_query_start(spark, kafka, tmp_path):
    name, _ = topic(kafka, "opts")
    read = spark.read.format("ottla")
    assert "kafka.bootstrap.servers" in _failure(lambda: read.option("subscribe", name).load())
    assert "unknown topic" in _failure(
        lambda: read.options(**with_bootstrap(kafka, subscribe="no-such-topic")).load())
    assert "not valid JSON" in _failure(
        lambda: read.options(**with_bootstrap(kafka, subscribe=name, startingOffsets="{bad")).load().collect())
    assert "exactly one of" in _failure(
        lambda: read.options(**with_bootstrap(kafka, subscribe=name, assign=json.dumps({name: [0]}))).load())
    assert "unknown option" in _failure(
        lambda: read.options(**with_bootstrap(kafka, subscribe=name, startingOffset="earliest")).load())
    assert "batch reads only" in _failure(lambda: spark.readStream.format("ottla").options(
        **with_bootstrap(kafka, subscribe=name, endingOffsets="latest")).load().writeStream.format("noop")
        .start().awaitTermination(60))

    bad = spark.range(3).select(col("id").alias("value"))
    assert "column 'value' must be string or binary" in _failure(
        lambda: bad.write.format("ottla").options(**with_bootstrap(kafka, topic=name)).mode("append").save())
    strings = spark.range(3).select(col("id").cast("string").alias("value"))
    assert "mode('append')" in _failure(
        lambda: strings.write.format("ottla").options(**with_bootstrap(kafka, topic=name)).mode("overwrite").save())
    assert "'topic'" in _failure(
        lambda: strings.write.format("ottla").options(**with_bootstrap(kafka)).mode("append").save())
    stream = spark.readStream.format("rate").load().select(lit(1).alias("value"))
    assert "column 'value' must be string or binary" in _failure(lambda: stream.writeStream.format("ottla").options(
        **with_bootstrap(kafka, topic=name)).option("checkpointLocation", str(tmp_path)).start().awaitTermination(60))


# --- batch ---------------------------------------------------------------------------------------------


def test_batch_write_then_read_with_headers_offsets_and_split_ranges(spark, kafka):
    name, partitions = topic(kafka, "batch")
    rows = [(f"k{i}", f"v{i}", i % partitions, [("n", str(i).encode())]) for i in range(40)]
    df = spark.createDataFrame(rows, "key string, value string, partition int, "
                                     "headers array<struct<key: string, value: binary>>")
    df.write.format("ottla").options(**with_bootstrap(kafka, topic=name)).mode("append").save()

    out = (spark.read.format("ottla")
           .options(**with_bootstrap(kafka, subscribe=name, includeHeaders="true", maxRecordsPerPartition="4"))
           .load())
    assert out.rdd.getNumPartitions() >= 40 // 4
    got = out.collect()
    assert {(r.key.decode(), r.value.decode(), r.partition, r.headers[0].value.decode()) for r in got} == {
        (k, v, p, h.decode()) for k, v, p, [(_, h)] in rows}
    assert {(r.topic, r.timestampType) for r in got} == {(name, 0)}  # 0: CreateTime

    offsets = json.dumps({name: {"0": 2}}), json.dumps({name: {"0": 5}})
    window = (spark.read.format("ottla")
              .options(**with_bootstrap(kafka, assign=json.dumps({name: [0]}), startingOffsets=offsets[0],
                                      endingOffsets=offsets[1])).load())
    assert [r.offset for r in window.orderBy("offset").collect()] == [2, 3, 4]


def test_batch_read_ranges_that_end_on_transaction_markers(spark, kafka):
    """Every task's range below ends on a commit marker, an offset no consumer ever sees: the tasks must
    finish on the consumer position, not wait for a record at offset end - 1."""
    name, _ = topic(kafka, "markers")
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"markers-{name}"})
    producer.init_transactions(30)
    for batch in range(3):  # offsets: 3 records then the marker, three times; 12 offsets in all
        producer.begin_transaction()
        for i in range(3):
            producer.produce(name, f"{batch}-{i}".encode(), partition=0)
        producer.commit_transaction(30)
    df = (spark.read.format("ottla")
          .options(**with_bootstrap(kafka, assign=json.dumps({name: [0]}), maxRecordsPerPartition="4",
                                  **{"kafkaConsumer.pollTimeoutMs": "20000"}))
          .load())
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.offset for r in df.collect()) == [0, 1, 2, 4, 5, 6, 8, 9, 10]


def test_batch_read_returns_exactly_the_committed_records(spark, kafka):
    name, partitions = topic(kafka, "txn")
    config = {"bootstrap.servers": kafka.bootstrap}
    done = Producer({**config, "transactional.id": f"done-{name}"})
    done.init_transactions(30)
    for batch in range(3):
        done.begin_transaction()
        for p in range(partitions):
            done.produce(name, f"committed-{batch}-{p}".encode(), partition=p)
        done.flush(30)
        if batch == 1:
            done.abort_transaction(30)  # flushed first, so the aborted records are in the log
        else:
            done.commit_transaction(30)
    hanging = Producer({**config, "transactional.id": f"open-{name}"})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    for p in range(partitions):
        hanging.produce(name, f"open-{p}".encode(), partition=p)
    hanging.flush(30)

    # Per partition: committed record, marker, aborted record, marker, committed record, marker, open
    # record. Ranges of two offsets: one holds only an aborted record and its marker.
    read = spark.read.format("ottla").options(**with_bootstrap(kafka, subscribe=name, maxRecordsPerPartition="2"))
    got = sorted(r.value.decode() for r in read.load().collect())
    assert got == sorted(f"committed-{b}-{p}" for b in (0, 2) for p in range(partitions))
    dirty = read.option("kafka.isolation.level", "read_uncommitted").load()
    assert {r.value.decode() for r in dirty.collect()} >= {f"committed-1-{p}" for p in range(partitions)} | {
        f"open-{p}" for p in range(partitions)}
    hanging.abort_transaction(30)


# --- streaming read ------------------------------------------------------------------------------------


def test_stream_read_admission_control_and_restart(spark, kafka, tmp_path):
    name, partitions = topic(kafka, "stream-in")
    produce(kafka, name, partitions, [f"a{i}" for i in range(30)])
    query_name = f"q_{uuid.uuid4().hex[:8]}"

    def run() -> list[int]:
        query = (spark.readStream.format("ottla")
                 .options(**with_bootstrap(kafka, subscribe=name, startingOffsets="earliest",
                                         maxOffsetsPerTrigger="10"))
                 .load().selectExpr("CAST(value AS STRING) AS value")
                 .writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .queryName(query_name).trigger(availableNow=True).start())
        assert query.awaitTermination(120), "the availableNow query did not finish"
        return [p.numInputRows for p in query.recentProgress if p.numInputRows]

    assert run() == [10, 10, 10]
    produce(kafka, name, partitions, [f"b{i}" for i in range(5)])
    assert run() == [5]
    values = [r.value for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert Counter(values) == Counter([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(5)])


# --- exactly-once streaming write ----------------------------------------------------------------------


class FaultyOttla(OttlaDataSource):
    """The `ottla` sink with failures injected around it, from option `faults` (JSON):

    * fail_after_commit [batch, partition]: the task raises after its transaction committed;
    * crash_before_commit [batch, partition]: the Python worker dies after producing, before committing;
    * fail_spark_commit batch: the driver fails the batch after every task committed, before Spark
      writes its commit log: the query stops and a restart replays the batch.

    Each task fault fires on the first attempt only, so Spark's task retry succeeds.
    """

    @classmethod
    def name(cls) -> str:
        return "ottla_faulty"

    def streamWriter(self, schema, overwrite):
        options = CaseInsensitiveDict({k: v for k, v in self.options.items() if k != "faults"})
        return FaultyWriter(OttlaDataSource(options).streamWriter(schema, overwrite),
                            json.loads(self.options.get("faults", "{}")))


class FaultyWriter(DataSourceStreamArrowWriter):
    def __init__(self, inner, faults: dict):
        self.inner = inner
        self.faults = faults

    def _fires(self, fault: str) -> bool:
        context = TaskContext.get()
        here = [int(context.getLocalProperty("streaming.sql.batchId")), context.partitionId()]
        return context.attemptNumber() == 0 and self.faults.get(fault) == here

    def write(self, iterator):
        if self._fires("crash_before_commit"):
            iterator = _then_crash(iterator)
        result = self.inner.write(iterator)
        if self._fires("fail_after_commit"):
            raise RuntimeError("injected: task fails after its transaction committed")
        return result

    def commit(self, messages, batchId):
        if self.faults.get("fail_spark_commit") == batchId:
            raise RuntimeError("injected: batch fails before Spark's commit log")
        self.inner.commit(messages, batchId)

    def abort(self, messages, batchId):
        self.inner.abort(messages, batchId)


def _then_crash(batches):
    yield from batches
    time.sleep(1)  # let the producer send what it was given: the open transaction then holds records
    os._exit(1)


def run_faulty_pipeline(spark, kafka, tmp_path, guarantee: str, packed: bool = False) -> tuple[list[str], list[str]]:
    """Copy an input topic to an output topic in 4 micro-batches, with every kind of failure injected;
    then restart from the checkpoint. Returns (input values, output values). Each micro-batch reads one
    task per topic-partition (`minPartitions`), or with `packed` all its small ranges in one task."""
    spark.dataSource.register(FaultyOttla)
    source, partitions = topic(kafka, "eos-in")
    sink, sink_partitions = topic(kafka, "eos-out")
    values = [f"r{i}" for i in range(40)]
    produce(kafka, source, partitions, values)

    planning = {} if packed else {"minPartitions": str(partitions)}

    def run(faults: dict):
        query = (spark.readStream.format("ottla")
                 .options(**with_bootstrap(kafka, subscribe=source, startingOffsets="earliest",
                                         maxOffsetsPerTrigger="10", **planning))
                 .load().select("key", "value")
                 .writeStream.format("ottla_faulty")
                 .options(**with_bootstrap(kafka, topic=sink, deliveryGuarantee=guarantee, faults=json.dumps(faults)))
                 .option("checkpointLocation", str(tmp_path / f"checkpoint-{guarantee}"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the query did not finish"
        except StreamingQueryException as failure:
            return failure
        return None

    error = run({"fail_after_commit": [1, 0], "crash_before_commit": [2, 0 if packed else 1], "fail_spark_commit": 3})
    assert error is not None and "before Spark's commit log" in str(error)
    assert run({}) is None
    return values, consume_committed(kafka, sink, sink_partitions)


def test_stream_write_is_exactly_once_through_task_retries_and_restart(spark, kafka, tmp_path):
    values, written = run_faulty_pipeline(spark, kafka, tmp_path, "exactly_once")
    assert Counter(written) == Counter(values)


def test_stream_write_is_exactly_once_when_small_ranges_share_a_task(spark, kafka, tmp_path):
    """The same failures when each micro-batch's ranges are read by one task (one transaction)."""
    values, written = run_faulty_pipeline(spark, kafka, tmp_path, "exactly_once", packed=True)
    assert Counter(written) == Counter(values)


def test_the_same_failures_duplicate_records_when_at_least_once(spark, kafka, tmp_path):
    """The control experiment: without the transactional sink the faults above do produce duplicates."""
    values, written = run_faulty_pipeline(spark, kafka, tmp_path, "at_least_once")
    counts = Counter(written)
    assert set(counts) == set(values)
    assert sum(counts.values()) > len(values), "the injected failures should have produced duplicates"
