"""Run a real Ottla broker for tests and scripts.

`with ottla.testing.broker() as b: Producer({"bootstrap.servers": b.bootstrap})` starts
`ottla serve` as a subprocess on a free loopback port with a temporary data directory.
The handle can kill (-9), stop (SIGTERM) and restart the same broker on the same port,
which is what crash tests need.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Iterator, Mapping

# Every handle that started a broker, for a test failure report to show the brokers' logs.
STARTED: "weakref.WeakSet[BrokerProcess]" = weakref.WeakSet()


class BrokerProcess:
    def __init__(self, data_dir: str | Path, config: Mapping[str, object] | None = None,
                 *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 extra_args: list[str] | None = None, env: Mapping[str, str] | None = None,
                 start_timeout: float = 30.0):
        self.data_dir = Path(data_dir)
        self.config = dict(config or {})
        self.host = host
        self.port = port
        self.log_level = log_level
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})  # added to os.environ at each start (e.g. OTTLA_FAILPOINTS)
        self.process: subprocess.Popen | None = None
        self.start_timeout = start_timeout  # for start() and restart()
        self.stderr_path = self.data_dir.parent / f"{self.data_dir.name}.stderr.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, timeout: float | None = None) -> "BrokerProcess":
        timeout = self.start_timeout if timeout is None else timeout
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        ready = self.data_dir.parent / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        command = [sys.executable, "-m", "ottla.cli", "serve", "--data-dir", str(self.data_dir),
                   "--listen", f"{self.host}:{self.port}", "--ready-file", str(ready),
                   "--log-level", self.log_level, *self.extra_args]
        for key, value in self.config.items():
            command += ["--config", f"{key}={value}"]
        stderr = open(self.stderr_path, "ab")
        STARTED.add(self)
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                        env={**os.environ, **self.env})
        stderr.close()
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"ottla serve exited with {self.process.returncode}:\n{self.read_stderr()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ottla serve did not become ready in {timeout}s:\n{self.read_stderr()}")
            time.sleep(0.02)
        self.port = int(ready.read_text().strip().rpartition(":")[2])
        return self

    def read_stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """Clean shutdown with SIGTERM; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        self.process.send_signal(signal.SIGCONT)  # a paused broker handles SIGTERM once resumed
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("ottla serve did not stop on SIGTERM")

    def kill(self) -> None:
        """kill -9: the crash every durable structure must survive."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, *, crash: bool = False) -> "BrokerProcess":
        """Stop (or kill -9) and start again on the same port and data dir."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets and its ZooKeeper session, but answers nothing."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


@contextlib.contextmanager
def broker(config: Mapping[str, object] | None = None, *, data_dir: str | Path | None = None,
           log_level: str = "warning") -> Iterator[BrokerProcess]:
    """Start a broker for the duration of the block; its temp dir is removed afterwards."""
    owned = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="ottla-")) if owned else Path(data_dir).parent
    handle = BrokerProcess(root / "data" if owned else data_dir, config, log_level=log_level)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
        if owned:
            shutil.rmtree(root, ignore_errors=True)
