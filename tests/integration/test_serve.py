"""`ottla serve` as an operator runs it: clean shutdown, bad configs, bad arguments."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def _serve(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "ottla.cli", "serve", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_sigterm_flushes_checkpoints_and_exits_zero(ottla_broker):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic("kept", 2, 1)])["kept"].result(10)
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap})
    for i in range(100):
        producer.produce("kept", value=b"x", partition=i % 2)
    assert producer.flush(10) == 0
    assert ottla_broker.stop() == 0
    data = ottla_broker.data_dir
    assert (data / ".kafka_cleanshutdown").exists()
    checkpoint = (data / "recovery-point-offset-checkpoint").read_text().split("\n")
    assert "kept 0 50" in checkpoint and "kept 1 50" in checkpoint
    # Starting again consumes the marker: a crash from now on must be noticed.
    ottla_broker.start()
    assert not (data / ".kafka_cleanshutdown").exists()


@pytest.mark.parametrize("args, message", [
    (["--config", "no.such.setting=1"], "unknown broker config 'no.such.setting'"),
    (["--config", "num.partitions=many"], "invalid value 'many' for config num.partitions"),
    (["--config", "log.segment.bytes=10"], "must be at least 14"),
    (["--config", "num.partitions"], "--config expects key=value"),
    (["--listen", "localhost"], "--listen expects HOST:PORT"),
    (["--listen", "127.0.0.1:99999"], "port 99999 is out of range"),
    (["--advertised", "host:port"], "numeric port"),
])
def test_bad_configuration_is_refused_with_a_clear_message(tmp_path, args, message):
    result = _serve("--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_kafka_configs_ottla_does_not_implement_start_with_one_warning_each(ottla_broker_factory):
    broker = ottla_broker_factory({"num.io.threads": 16, "socket.listen.backlog.size": 100})
    warnings = [line for line in broker.read_stderr().splitlines() if "level=WARNING" in line]
    assert [line.split("logger=ottla.config ", 1)[1] for line in warnings] == [
        f"broker config {name} is a Kafka config Ottla does not implement: it is ignored"
        for name in ("num.io.threads", "socket.listen.backlog.size")]


def test_port_in_use_is_reported_and_leaves_a_clean_log(ottla_broker, tmp_path):
    result = _serve("--data-dir", str(tmp_path / "other"), "--listen", ottla_broker.bootstrap)
    assert result.returncode == 1
    assert "address already in use" in result.stderr.lower()
    assert "Traceback" not in result.stderr
    assert (tmp_path / "other" / ".kafka_cleanshutdown").exists()


def test_unknown_command_line_flag_is_a_usage_error(tmp_path):
    result = _serve("--data-dir", str(tmp_path), "--no-such-flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_second_broker_on_the_same_data_dir_is_refused(ottla_broker):
    result = _serve("--data-dir", str(ottla_broker.data_dir), "--listen", "127.0.0.1:0")
    assert result.returncode == 1
    assert "is in use by another broker" in result.stderr
    assert "Traceback" not in result.stderr
    assert ottla_broker.running()


def test_a_single_node_broker_loads_no_module_it_does_not_serve_with(tmp_path):
    """Time to serving: ZooKeeper's client, the controller's state machines, Spark, Arrow, the
    Kafka clients, numpy (the validator's fast path, loaded on the first large batch),
    Hypothesis (which kio registers its types with when installed), the client commands,
    importlib.metadata (the crc32c package's `__init__` looks its version up with it),
    multiprocessing (the cleaner's first pass needs it) and ctypes.util (its find_library runs
    `ldconfig` in a subprocess) stay unloaded."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "ottla.cli", "serve", "--data-dir",
                             str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--ready-file", str(ready)],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    loaded = {line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert "ottla.server.broker" in loaded  # what -X importtime reports is what was imported
    unwanted = {"kazoo", "ottla.cluster.zk", "ottla.server.cluster_node", "ottla.server.replica_fetcher", "pyspark",
                "pyarrow", "confluent_kafka", "kafka", "aiokafka", "numpy", "hypothesis", "ottla.cli_commands",
                "importlib.metadata", "multiprocessing", "ctypes.util"}
    assert loaded & unwanted == set()


def _voluntary_switches(pid: int) -> int:
    """How often the broker's main thread (the event loop's) has gone to sleep so far."""
    status = (Path("/proc") / str(pid) / "task" / str(pid) / "status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_idle_broker_lets_its_event_loop_sleep(ottla_broker):
    """Nothing to do, nothing woken: the loop-hold probe is told of each iteration by the selector
    instead of waking the loop every 10 ms, which cost 20 ms of CPU per second on a 2-CPU VM shared
    with Spark (issue 16). Before: 190-200 wake-ups in 2 s; periodic duties take a few."""
    AdminClient({"bootstrap.servers": ottla_broker.bootstrap}).list_topics(timeout=10)
    time.sleep(1)  # start-up's and the client's work done
    before = _voluntary_switches(ottla_broker.pid)
    time.sleep(2)
    assert _voluntary_switches(ottla_broker.pid) - before < 40
