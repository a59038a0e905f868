"""The source's own Fetch client (ottla/spark/fetch.py) against a real broker, without Spark."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ottla.spark.fetch import read_columns
from ottla.spark.options import DataLossError, parse_read_options


def test_deleted_offsets_fail_the_read_or_are_skipped(kafka):
    kafka.create_topic("deleted")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        producer.produce("deleted", str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    deleted = admin.delete_records([TopicPartition("deleted", 0, 4)])
    assert next(iter(deleted.values())).result(30).low_watermark == 4

    def read(fail_on_data_loss: str) -> list[int]:
        options = parse_read_options({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": "deleted",
                                      "failOnDataLoss": fail_on_data_loss})
        return [o for columns in read_columns("deleted", 0, 0, 10, options, None) for o in columns.offsets.tolist()]

    with pytest.raises(DataLossError, match=r"offsets 0\.\.4 are no longer available"):
        read("true")
    assert read("false") == list(range(4, 10))
