"""Fixtures for the Spark tests: one local SparkSession and one Kafka-protocol cluster per module.

`kafka` is a real Ottla broker. librdkafka's in-process mock cluster is the fallback (one line in
`kafka()`), for working on the data source while the broker is broken: the tests that need the
transactional read path then skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


@dataclass
class Kafka:
    bootstrap: str
    transactional: bool
    """True when the broker implements the transactional read path: last stable offset, aborted-record
    filtering, and transactional offset commits. The librdkafka mock accepts transactional requests
    but implements none of the three."""
    create_topic: Callable[[str], int]
    """Create a topic and return its number of partitions."""


@contextlib.contextmanager
def mock_cluster() -> Iterator[Kafka]:
    """librdkafka's mock cluster on loopback ports, alive as long as the handle that created it."""
    handle = Producer({"test.mock.num.brokers": 3, "log_level": 3})
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in handle.list_topics(timeout=10).brokers.values())

    def create_topic(name: str) -> int:
        # The mock has no controller for CreateTopics; a producer's metadata request auto-creates a topic.
        return len(handle.list_topics(name, timeout=10).topics[name].partitions)

    yield Kafka(bootstrap, transactional=False, create_topic=create_topic)


@contextlib.contextmanager
def ottla_cluster(partitions: int = 2) -> Iterator[Kafka]:
    """A real Ottla broker (`ottla serve`) in a subprocess."""
    import ottla.testing

    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})

        def create_topic(name: str) -> int:
            admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
            return partitions

        yield Kafka(broker.bootstrap, transactional=True, create_topic=create_topic)


@pytest.fixture(scope="module")
def kafka() -> Iterator[Kafka]:
    with ottla_cluster() as cluster:  # or, without a transactional broker: with mock_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark():
    """`local[2,3]`: two cores, and a failed task is retried (up to 3 attempts), as on a cluster."""
    from pyspark.sql import SparkSession

    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("Spark needs Java")

    import ottla.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must see this venv's packages
    session = (SparkSession.builder.master("local[2,3]").appName("ottla-spark-tests")
               .config("spark.sql.shuffle.partitions", 2)
               .config("spark.ui.enabled", False)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    ottla.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def needs_transactions(kafka: Kafka) -> None:
    if not kafka.transactional:
        pytest.skip("the librdkafka mock cluster has no last stable offset, no aborted-record filtering and "
                    "no transactional offset commits; run against Ottla's broker (see conftest.kafka)")
