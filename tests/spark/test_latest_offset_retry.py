"""An end offset below what a streaming query already read is read again before it counts as data loss,
as Spark's Kafka source does (`fetchOffset.numRetries`, `fetchOffset.retryIntervalMs`).

The driver's planning (StreamReader) against a real broker, without a Spark session: the query's start
offset (from its checkpoint) is ahead of the partition's end, as after an answer that went back; records
produced while the source waits bring the end up to it again."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from ottla.spark.options import DataLossError, parse_read_options
from ottla.spark.source import StreamReader, source_schema


class _Retries(logging.Handler):
    """The source's warnings that it reads the end offsets again."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "reading again" in message:
            self.messages.append(message)
            self.first.set()


@pytest.fixture
def retries():
    handler = _Retries()
    logger = logging.getLogger("ottla.spark.source")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _reader(bootstrap: str, topic: str, **options) -> StreamReader:
    return StreamReader(parse_read_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}),
                        source_schema(include_headers=False))


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, b"%d" % i, partition=0)
    assert producer.flush(60) == 0


def test_an_end_offset_that_went_back_is_read_again_until_it_is_back(kafka, retries):
    topic = "went-back"
    kafka.create_topic(topic)
    _produce(kafka.bootstrap, topic, 3)
    reader = _reader(kafka.bootstrap, topic, **{"fetchOffset.numRetries": "600", "fetchOffset.retryIntervalMs": "100"})
    start = {topic: {"0": 5, "1": 0}}

    def catch_up():
        # Only once the source has seen the end below 5, so the first answer is always the lower one.
        retries.first.wait(60)
        _produce(kafka.bootstrap, topic, 2)

    producer = threading.Thread(target=catch_up)
    producer.start()
    try:
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 5, "1": 0}}
    finally:
        retries.first.set()  # no waiting out the minute when latestOffset failed without a retry
        producer.join()
    assert "went-back-0': (5, 3)" in retries.messages[0]


def test_an_end_offset_still_below_after_the_retries_is_data_loss(kafka, retries):
    topic = "stays-back"
    kafka.create_topic(topic)
    _produce(kafka.bootstrap, topic, 3)
    reader = _reader(kafka.bootstrap, topic, **{"fetchOffset.numRetries": "2", "fetchOffset.retryIntervalMs": "1"})
    with pytest.raises(DataLossError, match="stays-back-0: end offset 3 is below offset 5"):
        reader.latestOffset({topic: {"0": 5, "1": 0}}, ReadAllAvailable())
    assert len(retries.messages) == 2
