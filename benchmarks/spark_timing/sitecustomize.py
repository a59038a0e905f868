"""Timing probes for `benchmarks/spark_pipeline.py --probes`: every Python process Spark starts (the
driver's planner and source runners, the sink's commit runner, the executors' workers) imports this through
PYTHONPATH, and appends one JSON line per Kafka client call, per data-source call and per first import of the
connector's modules to $OTTLA_SPARK_TIMING: process id, name, wall seconds, process CPU seconds (librdkafka's
threads included). The probes import nothing themselves: each module is wrapped when the process first imports
it, so a worker's imports (what a fresh one pays in its first task) are timed, not moved to its start. They
change no behaviour."""

import importlib.abc
import json
import os
import sys
import time

_PATH = os.environ.get("OTTLA_SPARK_TIMING")


def _record(name: str, wall: float, cpu: float, queued: float | None = None) -> None:
    record = {"pid": os.getpid(), "name": name, "wall": wall, "cpu": cpu, "at": time.time()}
    if queued is not None:
        record["queued"] = queued
    task = _task()
    if task is not None:
        record["task"] = task
    with open(_PATH, "a") as out:
        out.write(json.dumps(record) + "\n")


def _task() -> int | None:
    """The Spark partition of the task this process runs (None outside a task): the timeline groups by it."""
    pyspark = sys.modules.get("pyspark")
    context = pyspark.TaskContext.get() if pyspark is not None and hasattr(pyspark, "TaskContext") else None
    return None if context is None else context.partitionId()


def _queued() -> float:
    """Seconds this process's main thread has waited for a core so far (the kernel's schedstat): of a call's
    wall time that is neither its CPU nor a wait of its own (an answer, Spark's rows)."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _timed(name, function):
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - wall, time.process_time() - cpu)
    return wrapper


def _timed_generator(name, function):
    """A generator's time from the call to its exhaustion (what a read task spends in the source), with the
    time its thread waited for a core."""
    def wrapper(*args, **kwargs):
        wall, cpu, queued = time.perf_counter(), time.process_time(), _queued()
        try:
            yield from function(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - wall, time.process_time() - cpu, _queued() - queued)
    return wrapper


def _patch(cls, label, methods):
    for m in methods:
        if hasattr(cls, m):
            setattr(cls, m, _timed(f"{label}.{m}", getattr(cls, m)))


def _confluent_kafka(module) -> None:
    module.Producer = type("Producer", (module.Producer,), {m: _timed(f"Producer.{m}", getattr(module.Producer, m))
                           for m in ["__init__", "init_transactions", "begin_transaction",
                                     "send_offsets_to_transaction", "flush", "commit_transaction",
                                     "abort_transaction"]})
    module.Consumer = type("Consumer", (module.Consumer,), {m: _timed(f"Consumer.{m}", getattr(module.Consumer, m))
                           for m in ["__init__", "committed", "assign", "unassign", "close"]})


def _admin(module) -> None:
    admin = module.AdminClient  # a Python class that names itself in super(): patch it in place
    for m in ("__init__", "list_topics"):
        setattr(admin, m, _timed(f"AdminClient.{m}", getattr(admin, m)))

    def list_offsets(self, *args, **kwargs):  # the caller waits on the futures at once: time the answers
        futures = base_list_offsets(self, *args, **kwargs)
        for future in futures.values():
            future.exception()
        return futures
    base_list_offsets = admin.list_offsets
    admin.list_offsets = _timed("AdminClient.list_offsets", list_offsets)


def _package(module) -> None:
    _patch(module.OttlaDataSource, "OttlaDataSource", ["schema", "writer", "streamReader", "streamWriter"])


def _source(module) -> None:
    _patch(module.StreamReader, "StreamReader", ["initialOffset", "latestOffset", "partitions", "commit",
                                                 "prepareForTriggerAvailableNow"])
    module.StreamReader.read = _timed_generator("StreamReader.read", module.StreamReader.read)


def _sink(module) -> None:
    module.StreamWriter.write = _timed_call("StreamWriter.write", module.StreamWriter.write)
    _patch(module.StreamWriter, "StreamWriter", ["commit"])
    _patch(module.BatchWriter, "BatchWriter", ["write"])
    module.check_topic_exists = _timed("check_topic_exists", module.check_topic_exists)
    module._rows = _waited("sink input wait", module._rows)


def _timed_call(name, function):
    """`_timed` with the time the thread waited for a core (a write task's whole call)."""
    def wrapper(*args, **kwargs):
        wall, cpu, queued = time.perf_counter(), time.process_time(), _queued()
        try:
            return function(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - wall, time.process_time() - cpu, _queued() - queued)
    return wrapper


def _waited(name, function):
    """An iterator's time spent in `next` (a writer waiting for Spark's rows), recorded once at its end."""
    def wrapper(*args, **kwargs):
        inner = iter(function(*args, **kwargs))
        wall = cpu = 0.0
        try:
            while True:
                w, c = time.perf_counter(), time.process_time()
                try:
                    item = next(inner)
                except StopIteration:
                    return
                finally:
                    wall, cpu = wall + time.perf_counter() - w, cpu + time.process_time() - c
                yield item
        finally:
            _record(name, wall, cpu)
    return wrapper


def _producer(module) -> None:
    _patch(module.OwnProducer, "OwnProducer", ["__init__", "_refresh", "flush", "send", "_take"])


def _transactional(module) -> None:
    """Each coordinator request by its API (its wait for the Produce answers in flight included), and the
    task's steps."""
    producer = module.TransactionalProducer
    _patch(producer, "TransactionalProducer", ["committed", "send_offsets", "commit", "_end"])
    ask = producer._ask

    def timed_ask(self, key_type, key, request, error):
        return _timed(f"txn {type(request).__name__}", ask)(self, key_type, key, request, error)
    producer._ask = timed_ask


def _fetch(module) -> None:
    module._Reader._request = _timed("Fetch answer", module._Reader._request)


def _kernels(module) -> None:
    """Each compiled loop's first call per signature (numba loads it from the disk cache or compiles it: the
    name says which), and the pid's switch in `import ottla.spark.kernels` (numba's import included)."""
    for name in ("scan_batches", "walk_records", "walk_headers", "partitions_of", "partition_order", "lay_out"):
        dispatcher = getattr(module, name, None)
        if dispatcher is not None:
            setattr(module, name, _first_calls(name, dispatcher))


def _first_calls(name, dispatcher):
    def wrapper(*args):
        known = len(dispatcher.signatures)
        if known and not _first_call_pending(dispatcher, args):
            return dispatcher(*args)
        hits, misses = sum(dispatcher._cache_hits.values()), sum(dispatcher._cache_misses.values())
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return dispatcher(*args)
        finally:
            if len(dispatcher.signatures) != known:
                how = ("cache hit" if sum(dispatcher._cache_hits.values()) > hits else
                       "compiled" if sum(dispatcher._cache_misses.values()) > misses else "loaded")
                _record(f"kernels.{name} new signature ({how})", time.perf_counter() - wall,
                        time.process_time() - cpu)
    return wrapper


def _first_call_pending(dispatcher, args) -> bool:
    """Whether these arguments' types are new to the dispatcher (typing them costs a few us: worth it here)."""
    try:
        return tuple(dispatcher.typeof_pyval(a) for a in args) not in {tuple(s) for s in dispatcher.signatures}
    except Exception:
        return True


# Module -> what to wrap in it once imported; each module's first import is timed too.
_WATCHED = {"confluent_kafka": _confluent_kafka, "confluent_kafka.admin": _admin, "ottla.spark": _package,
            "ottla.spark.source": _source, "ottla.spark.sink": _sink, "ottla.spark.producer": _producer,
            "ottla.spark.transactional": _transactional, "ottla.spark.fetch": _fetch,
            "ottla.spark.kernels": _kernels, "numba": None, "kio.static.primitive": None}


class _TimedLoader(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            self._loader.exec_module(module)
        finally:
            _record(f"import {self._name}", time.perf_counter() - wall, time.process_time() - cpu)
        if _WATCHED[self._name] is not None:
            _WATCHED[self._name](module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = _TimedLoader(spec.loader, name)
                    return spec
        return None


if _PATH:
    sys.meta_path.insert(0, _Finder())
