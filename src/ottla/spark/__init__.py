"""Spark data source `ottla`: Kafka topics as DataFrames, batch and streaming, read and write.

    import ottla.spark
    ottla.spark.register(spark)
    df = spark.readStream.format("ottla").option("kafka.bootstrap.servers", "localhost:9092") \\
        .option("subscribe", "events").load()

Options and columns are those of Spark's built-in `kafka` format; see docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import DataLossError, OptionError, parse_read_options, parse_write_options

if TYPE_CHECKING:
    from .sink import BatchWriter, StreamWriter
    from .source import BatchReader, StreamReader

__all__ = ["OttlaDataSource", "OptionError", "DataLossError", "register"]

_MIN_PYSPARK = (4, 2)  # latestOffset(start, limit): admission control for Python streaming sources


class OttlaDataSource(DataSource):
    """Options are checked (and subscribed topics looked up) before any task runs."""

    @classmethod
    def name(cls) -> str:
        return "ottla"

    # The source is imported where something is read, as the sink where something is written: a write task's
    # fresh Python worker unpickles its writer from this package and would otherwise pay for the source's
    # modules (confluent-kafka's admin client among them) without reading a row.

    def schema(self) -> StructType:
        from .source import Cluster, source_schema

        options = parse_read_options(self.options)
        Cluster(options).partitions()
        return source_schema(options.include_headers)

    def reader(self, schema: StructType) -> BatchReader:
        from .source import BatchReader

        options = parse_read_options(self.options)
        _check_read_schema(schema, options.include_headers)
        return BatchReader(options, schema)

    def streamReader(self, schema: StructType) -> StreamReader:
        from .source import StreamReader

        options = parse_read_options(self.options)
        _check_read_schema(schema, options.include_headers)
        return StreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        if overwrite:
            raise OptionError("a topic is append-only: write with mode('append'), not 'overwrite'")
        from .sink import BatchWriter

        return BatchWriter(self._write_options(schema, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        from .sink import StreamWriter

        return StreamWriter(self._write_options(schema, streaming=True))

    def _write_options(self, schema: StructType, *, streaming: bool):
        # The sink is imported only where something is written: its modules (the own producer's Kafka
        # protocol schemas) are a third of the package's import, which the driver's streaming source
        # process, started afresh for every query, would otherwise pay for nothing.
        from .sink import check_input_schema, check_topic_exists

        options = parse_write_options(self.options, streaming=streaming)
        check_input_schema(schema, options)
        check_topic_exists(options)
        return options


def _check_read_schema(schema: StructType, include_headers: bool) -> None:
    from .source import source_schema

    expected = source_schema(include_headers)
    if schema.simpleString() != expected.simpleString():
        raise OptionError(f"the ottla source has a fixed schema {expected.simpleString()}; "
                          f"got {schema.simpleString()}")


def register(spark) -> None:
    """Make `format("ottla")` available in this Spark session."""
    import pyspark

    version = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    if version < _MIN_PYSPARK:
        raise RuntimeError(f"ottla.spark needs PySpark >= {'.'.join(map(str, _MIN_PYSPARK))}, "
                           f"found {pyspark.__version__}")
    spark.dataSource.register(OttlaDataSource)
