"""Process plumbing shared by the benchmark scripts: starting `ottla serve` and the librdkafka
mock cluster, waiting for a broker to answer, reading RSS, and making sure no child process
outlives the benchmark (errors, Ctrl-C and SIGTERM included)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

HERE = Path(__file__).resolve().parent
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB, from /proc/<pid>/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def ottla_command() -> list[str]:
    """The `ottla` console script of the interpreter running us (the project's venv)."""
    script = Path(sys.executable).parent / "ottla"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ottla.cli"]


class Children:
    """Owns every child process; `close()` (or leaving the `with`) terminates what is left.

    SIGTERM to the benchmark is turned into SystemExit so the same cleanup runs."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Children:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def spawn(self, args: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def run_json(self, command: list[str], what: str) -> dict:
        """Run a child that prints its result as JSON on its last stdout line; fail if it fails."""
        proc = self.spawn(command, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate()
        self.procs.remove(proc)
        if proc.returncode:
            raise RuntimeError(f"{what} process failed with code {proc.returncode}")
        return json.loads(out.strip().splitlines()[-1])

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> float:
        """SIGTERM, then SIGKILL after `timeout`; returns seconds until it exited."""
        started = time.monotonic()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)
        return time.monotonic() - started

    def close(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc, timeout=5)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def bytecode_cache_env(cache_dir: Path) -> dict[str, str]:
    """An environment whose Python processes keep compiled bytecode in `cache_dir`, as an
    installed package has it, even where PYTHONDONTWRITEBYTECODE is set (this project's shared
    machines set it: every broker start then compiled each module it imports, ~0.3-0.7 s).
    Warmed here by importing what `ottla serve` imports."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    subprocess.run([sys.executable, "-c", "import ottla.cli, ottla.server.main"], env=env, check=True)
    return env


def wait_for_metadata(bootstrap: str, timeout: float, proc: subprocess.Popen | None = None) -> float:
    """Poll until the broker answers a Metadata request; returns seconds waited. Fails early
    if `proc` (the broker we started) exits."""
    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "reconnect.backoff.max.ms": 100})
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with code {proc.returncode} before answering")
        try:
            admin.list_topics(timeout=0.5)
            return time.monotonic() - started
        except KafkaException:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"no Metadata answer from {bootstrap} within {timeout:.0f}s") from None


class Ottla:
    """`ottla serve` on a free port with its own data dir, its output kept in a log file."""

    def __init__(self, children: Children, data_dir: Path, extra_args: list[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.children = children
        self.data_dir = data_dir
        self.extra_args = list(extra_args)
        self.env = env
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> float:
        """Start and wait until it answers Metadata; returns the seconds that took."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = ottla_command() + ["serve", "--data-dir", str(self.data_dir), "--listen", self.bootstrap]
        with open(self.log_path, "ab") as log:
            self.proc = self.children.spawn(args + self.extra_args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            return wait_for_metadata(self.bootstrap, timeout, self.proc)
        except (RuntimeError, TimeoutError):
            progress(f"ottla failed to start; last lines of {self.log_path}:\n{self.log_tail()}")
            raise

    def serving_s(self) -> float | None:
        """Seconds from process start to serving, as the broker's last "serving on" line says
        ("started in X s": measured by the broker from the kernel's start time of its process,
        so interpreter start and imports are included); None if no such line."""
        for line in reversed(self.log_lines()):
            if "serving on" in line and "(started in " in line:
                return float(line.rpartition("(started in ")[2].split()[0])
        return None

    def stop(self) -> float:
        assert self.proc is not None
        return self.children.stop(self.proc, timeout=30)

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_lines()[-lines:]) or "(empty log)"


class Mock:
    """librdkafka's in-memory mock cluster, owned by a helper process (mock_cluster.py) that
    creates topics when asked on its stdin, since the mock does not implement CreateTopics."""

    def __init__(self, children: Children) -> None:
        self.proc = children.spawn(
            [sys.executable, str(HERE / "mock_cluster.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.bootstrap = self._reply("bootstrap")

    def _reply(self, expected: str) -> str:
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != expected:
            raise RuntimeError(f"mock cluster helper said {line!r}, expected {expected}")
        return line[1]

    def create_topic(self, topic: str, partitions: int) -> None:
        self.proc.stdin.write(f"{topic} {partitions}\n")
        self.proc.stdin.flush()
        self._reply("created")


def produce_blocking(producer, topic: str, value: bytes) -> None:
    """`producer.produce`, waiting while librdkafka's local queue is full instead of failing."""
    while True:
        try:
            producer.produce(topic, value)
            return
        except BufferError:  # local queue full: let librdkafka send
            producer.poll(0.005)
