"""Fixtures for the Spark tests: one local SparkSession and one real Ottla broker per module."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

from confluent_kafka.admin import AdminClient, NewTopic


@dataclass
class Kafka:
    bootstrap: str
    create_topic: Callable[[str], int]
    """Create a topic and return its number of partitions."""


@contextlib.contextmanager
def ottla_cluster(partitions: int = 2) -> Iterator[Kafka]:
    """A real Ottla broker (`ottla serve`) in a subprocess."""
    import ottla.testing

    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})

        def create_topic(name: str) -> int:
            admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
            return partitions

        yield Kafka(broker.bootstrap, create_topic=create_topic)


@pytest.fixture(scope="module")
def kafka() -> Iterator[Kafka]:
    with ottla_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark():
    """`local[2,3]`: two cores, and a failed task is retried (up to 3 attempts), as on a cluster."""
    from pyspark.sql import SparkSession

    assert os.environ.get("JAVA_HOME") or shutil.which("java"), "Spark needs Java: run scripts/install-system-deps.sh"

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
