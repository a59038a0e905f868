"""CPU of the driver's streaming source process, which Spark starts afresh for every streaming query.

Spark runs each Python streaming source in its own interpreter (`python -m
pyspark.sql.streaming.python_streaming_source_runner`), neither forked from the worker daemon nor reused:
it imports PySpark, unpickles the data source (importing `ottla.spark`) and answers initialOffset,
latestOffset, partitions and commit. This replays that in fresh interpreters against one real broker and
reports each child's CPU time (user + system, from wait4), variants alternated round by round, each with
PySpark imported two ways:

    zip         as Spark starts its Python processes: PYTHONPATH begins with $SPARK_HOME/python/lib/pyspark.zip
                and the py4j zip (PythonUtils.sparkPythonPath), and with pip's PySpark SPARK_HOME is the
                installed package, whose wheel ships that zip, sources only: PySpark is compiled anew in every
                fresh interpreter (zipimport reads bytecode from a zip but never writes any)
    pyc-zip     as zip, with a copy of pyspark.zip that also holds each module's bytecode (unchecked-hash
                .pyc files, PEP 552), built in a temporary directory: what a zip with bytecode would save
    site        PySpark from site-packages, its cached bytecode used

and three steps:

    runner      import the runner module only: PySpark's share, the floor
    import      the runner, then `import ottla.spark`
    query       the runner, unpickle an `ottla` data source, then one micro-batch's calls
                (initialOffset, latestOffset, partitions, commit) and stop

With several `--src` directories (e.g. the main checkout's src and a worktree's), each variant runs once
per directory per round, so two versions of the connector are compared under the same load.

    PYTHONPATH=src python benchmarks/source_runner.py --rounds 8 --src /work/main/src --src src
"""

from __future__ import annotations

import argparse
import importlib.util
import marshal
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
import zipfile

RUNNER = "import pyspark.sql.streaming.python_streaming_source_runner"

QUERY = RUNNER + """
import sys
from pyspark.serializers import CPickleSerializer
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable
source = CPickleSerializer().loads(bytes.fromhex(sys.argv[1]))
reader = _streamReader(source, source.schema())
start = reader.initialOffset()
end = reader.latestOffset(start, ReadAllAvailable())
reader.partitions(start, end)
reader.commit(end)
reader.stop()
"""


def pickled_source(bootstrap: str, topic: str) -> str:
    """The data source as the driver ships it to the runner (cloudpickle, by reference to ottla.spark)."""
    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.datasource import CaseInsensitiveDict

    from ottla.spark import OttlaDataSource

    source = OttlaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                              "startingOffsets": "earliest"}))
    return CloudPickleSerializer().dumps(source).hex()


def spark_zips() -> list[str]:
    """PySpark's and py4j's zips, which Spark puts first on the runner's PYTHONPATH, then the user's (read
    from a live runner's /proc/PID/environ; Spark also adds its spark-core jar, which holds no Python)."""
    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    return sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.endswith(".zip"))


def with_bytecode(source_zip: str, target_zip: str) -> None:
    """Copy a zip of Python sources adding an unchecked-hash .pyc beside each .py, which zipimport loads."""
    warnings.simplefilter("ignore", SyntaxWarning)  # PySpark's own tests have a few; compiling them is all we do
    with zipfile.ZipFile(source_zip) as given, zipfile.ZipFile(target_zip, "w", zipfile.ZIP_DEFLATED) as copy:
        for entry in given.infolist():
            data = given.read(entry)
            copy.writestr(entry, data)
            if entry.filename.endswith(".py"):
                code = compile(data, entry.filename, "exec", dont_inherit=True)
                flags = (1).to_bytes(4, "little")  # hash-based, source not checked
                pyc = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(data) + marshal.dumps(code)
                copy.writestr(entry.filename + "c", pyc)


def child_cpu(code: str, python_path: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=python_path)
    process = subprocess.Popen([sys.executable, "-c", code, *args], env=env)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"child failed (status {status}) with PYTHONPATH={python_path}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--src", action="append", help="PYTHONPATH of the children (repeatable)")
    args = parser.parse_args()
    sources = args.src or [os.environ.get("PYTHONPATH", "src")]

    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    import ottla.testing

    workdir = tempfile.mkdtemp(prefix="source-runner-")
    zips = spark_zips()
    pyc_zips = [os.path.join(workdir, os.path.basename(z)) for z in zips]
    for given, copy in zip(zips, pyc_zips):
        with_bytecode(given, copy)
    with ottla.testing.broker() as broker:
        topic = "runner"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(100):
            producer.produce(topic, b"x" * 100, partition=i % 2)
        producer.flush(30)
        pickled = pickled_source(broker.bootstrap, topic)
        load_before = open("/proc/loadavg").read().split()[:3]
        results: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(args.rounds):
            for src in sources:
                for pyspark_from, python_path in (("zip", os.pathsep.join([*zips, src])),
                                                  ("pyc-zip", os.pathsep.join([*pyc_zips, src])), ("site", src)):
                    for name, code, extra in (("runner", RUNNER, ()), ("import", RUNNER + "; import ottla.spark", ()),
                                              ("query", QUERY, (pickled,))):
                        cpu = child_cpu(code, python_path, *extra)
                        results.setdefault((pyspark_from, name, src), []).append(cpu)
        load_after = open("/proc/loadavg").read().split()[:3]
        del producer, admin  # closed before the broker stops
    shutil.rmtree(workdir)

    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; {args.rounds} rounds")
    print(f"{'pyspark':7} {'step':7} {'src':40} {'median s':>9} {'min s':>7} {'max s':>7}")
    for (pyspark_from, name, src), cpu in sorted(results.items()):
        print(f"{pyspark_from:7} {name:7} {src:40} {statistics.median(cpu):9.3f} {min(cpu):7.3f} {max(cpu):7.3f}")


if __name__ == "__main__":
    main()
