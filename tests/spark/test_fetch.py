"""The source's own Fetch client (ottla/spark/fetch.py) against a real broker, without Spark."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ottla.admin_client import FETCH, BrokerConnection
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


def _spy_fetches(monkeypatch) -> list[str]:
    """Record each Fetch the real connections send ("ask") and each answer they take ("answer")."""
    events: list[str] = []
    submit, receive = BrokerConnection.submit, BrokerConnection.receive

    def spy_submit(self, api_key, version, body):
        if api_key == FETCH:
            events.append("ask")
        return submit(self, api_key, version, body)

    def spy_receive(self, api_key, version, correlation_id):
        if api_key == FETCH:
            events.append("answer")
        return receive(self, api_key, version, correlation_id)

    monkeypatch.setattr(BrokerConnection, "submit", spy_submit)
    monkeypatch.setattr(BrokerConnection, "receive", spy_receive)
    return events


def test_the_next_fetch_is_sent_before_an_answer_is_handed_on(kafka, monkeypatch):
    """The broker reads and sends the next answer while the worker decodes this one and Spark takes it: when
    the first columns come out, the second Fetch has been sent and not yet answered. Failed before the reader
    asked ahead (one Fetch at a time: ask, answer, decode, hand on, then ask again)."""
    kafka.create_topic("ahead")
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 2000})
    for i in range(3000):
        producer.produce("ahead", b"%05d" % i + b"x" * 95, partition=0)
    assert producer.flush(30) == 0
    options = parse_read_options({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": "ahead",
                                  "kafka.max.partition.fetch.bytes": "20000"})
    events = _spy_fetches(monkeypatch)
    reads = read_columns("ahead", 0, 0, 3000, options, None)
    first = next(reads)
    assert events == ["ask", "answer", "ask"]
    offsets = first.offsets.tolist() + [o for columns in reads for o in columns.offsets.tolist()]
    assert offsets == list(range(3000))
    assert events.count("ask") == events.count("answer") >= 3  # the range's last answer asks for nothing more


def test_reading_ahead_keeps_read_committed_and_a_stopped_read_leaves_no_answer_behind(kafka, monkeypatch, caplog):
    """Small answers over aborted transactions and their markers: every Fetch asked ahead lands where the
    previous answer's batches end, aborted and control batches included, and only committed records come
    out. A task that stops mid-range (Spark's limit) leaves no answer on the worker's connection for the
    next one: its reads ask and take their own answers only."""
    kafka.create_topic("ahead-txn")
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "ahead-txn"})
    producer.init_transactions(30)
    committed = []
    for txn in range(12):
        producer.begin_transaction()
        values = [b"t%02d-%03d" % (txn, i) + b"y" * 90 for i in range(100)]
        for value in values:
            producer.produce("ahead-txn", value, partition=0)
        producer.flush(30)
        if txn % 3 == 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += values
    end = 12 * 101  # 100 records and a marker per transaction
    options = parse_read_options({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": "ahead-txn",
                                  "kafka.max.partition.fetch.bytes": "6000"})
    values = [v for columns in read_columns("ahead-txn", 0, 0, end, options, None)
              for v in columns.values.to_pylist()]
    assert values == committed
    events = _spy_fetches(monkeypatch)
    stopped = read_columns("ahead-txn", 0, 0, end, options, None)
    next(stopped)
    stopped.close()
    assert events == ["ask", "answer", "ask"]
    events.clear()
    caplog.set_level(logging.INFO, logger="ottla.spark.fetch")
    again = [v for columns in read_columns("ahead-txn", 0, 0, end, options, None)
             for v in columns.values.to_pylist()]
    assert again == committed
    assert events.count("ask") == events.count("answer")
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]  # no stray answer met
