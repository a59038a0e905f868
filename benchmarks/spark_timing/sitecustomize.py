"""Timing probes for `benchmarks/spark_pipeline.py --breakdown`: every Python process Spark starts (the
driver's source runner, the sink's commit runner, the executors' workers) imports this through
PYTHONPATH, and appends one JSON line per Kafka client call and per data-source call to
$OTTLA_SPARK_TIMING: process id, name, wall seconds, process CPU seconds (librdkafka's threads
included). The probes wrap the classes the connector imports; they change no behaviour."""

import json
import os
import time

_PATH = os.environ.get("OTTLA_SPARK_TIMING")


def _record(name: str, wall: float, cpu: float) -> None:
    with open(_PATH, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "name": name, "wall": wall, "cpu": cpu, "at": time.time()}) + "\n")


def _timed(name, function):
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - wall, time.process_time() - cpu)
    return wrapper


def _timed_generator(name, function):
    """A generator's time from the call to its exhaustion (what a read task spends in the source)."""
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield from function(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - wall, time.process_time() - cpu)
    return wrapper


def _subclass(base, label, methods):
    namespace = {m: _timed(f"{label}.{m}", getattr(base, m)) for m in methods}
    return type(base.__name__, (base,), namespace)


def _install() -> None:
    import confluent_kafka
    import confluent_kafka.admin

    confluent_kafka.Producer = _subclass(confluent_kafka.Producer, "Producer", [
        "__init__", "init_transactions", "begin_transaction", "send_offsets_to_transaction", "flush",
        "commit_transaction", "abort_transaction"])
    confluent_kafka.Consumer = _subclass(confluent_kafka.Consumer, "Consumer", [
        "__init__", "committed", "assign", "unassign", "close"])
    admin = confluent_kafka.admin.AdminClient  # a Python class that names itself in super(): patch it in place
    for m in ("__init__", "list_topics"):
        setattr(admin, m, _timed(f"AdminClient.{m}", getattr(admin, m)))

    def list_offsets(self, *args, **kwargs):  # the caller waits on the futures at once: time the answers
        futures = base_list_offsets(self, *args, **kwargs)
        for future in futures.values():
            future.exception()
        return futures
    base_list_offsets = admin.list_offsets
    admin.list_offsets = _timed("AdminClient.list_offsets", list_offsets)

    import ottla.spark
    from ottla.spark import sink, source

    for cls, methods in [(ottla.spark.OttlaDataSource, ["schema", "streamReader", "streamWriter"]),
                         (source.StreamReader, ["initialOffset", "latestOffset", "partitions", "commit",
                                                "prepareForTriggerAvailableNow"]),
                         (sink.StreamWriter, ["write", "commit"])]:
        for m in methods:
            setattr(cls, m, _timed(f"{cls.__name__}.{m}", getattr(cls, m)))
    source.StreamReader.read = _timed_generator("StreamReader.read", source.StreamReader.read)


if _PATH:
    _install()
