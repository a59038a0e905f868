"""Real ZooKeeper servers for tests: a standalone one, or a 3-node ensemble on loopback.

Runs Debian's `zookeeper` jars (`scripts/install-system-deps.sh`) with a config file and
data dir of its own in a temp dir, never `/etc/zookeeper` or `/var`. Each server is a
process the test can kill -9, restart on the same ports and data, or pause with SIGSTOP.
Tick times are short so sessions expire and elections finish quickly; `maxSessionTimeout`
is raised so clients still get the session timeout they ask for (ZooKeeper caps it at
20 ticks by default).

    with zookeeper() as zk:            # zk.connect == "127.0.0.1:PORT"
        ...
    with zookeeper_ensemble(3) as ens: # ens.connect lists all three; ens.leader() -> server
        ens.leader().kill()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

__all__ = ["ZooKeeperServer", "ZooKeeperEnsemble", "zookeeper", "zookeeper_ensemble", "four_letter_word"]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest's Class-Path names the rest
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")  # so failures are logged, at WARN
JVM_FLAGS = ["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-XX:-UsePerfData",
             "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dzookeeper.jmx.log4j.disable=true"]
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

_running: set["ZooKeeperServer"] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_running):
        server.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter_word(port: int, word: str = "srvr", timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command; '' when the server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """One ZooKeeper server process (standalone, or one member of an ensemble)."""

    def __init__(self, root: Path, client_port: int, *, my_id: int | None = None,
                 quorum: list[tuple[int, int, int]] | None = None, tick_ms: int = 100):
        self.root = Path(root)
        self.client_port = client_port
        self.my_id = my_id
        self.quorum = quorum  # [(id, peer port, election port)] for an ensemble
        self.tick_ms = tick_ms
        self.process: subprocess.Popen | None = None
        self.data_dir = self.root / "data"
        self.config_path = self.root / "zoo.cfg"
        self.log_path = self.root / "zookeeper.log"
        self.paused = False

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"tickTime={self.tick_ms}", f"dataDir={self.data_dir}",
                 "clientPortAddress=127.0.0.1", f"clientPort={self.client_port}",
                 "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,stat",
                 "minSessionTimeout=200", "maxSessionTimeout=120000",
                 "forceSync=no", "maxClientCnxns=0"]
        if self.quorum:
            # syncLimit in ticks: a follower further behind than this is dropped; keep it
            # forgiving on a loaded 2-core machine.
            lines += ["initLimit=50", "syncLimit=20", "electionPortBindRetry=3"]
            lines += [f"server.{i}=127.0.0.1:{peer}:{election}" for i, peer, election in self.quorum]
            (self.data_dir / "myid").write_text(f"{self.my_id}\n")
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> "ZooKeeperServer":
        if not ZOOKEEPER_JAR.exists():
            raise RuntimeError(f"{ZOOKEEPER_JAR} missing: run scripts/install-system-deps.sh")
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found: run scripts/install-system-deps.sh")
        self._write_config()
        classpath = f"{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([java, *JVM_FLAGS, "-cp", classpath, MAIN_CLASS, str(self.config_path)],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.root)
        log.close()
        self.paused = False
        _running.add(self)
        if wait:
            self.wait_serving(timeout)
        return self

    def serving(self) -> bool:
        """True when the server answers and is part of a working quorum (or standalone)."""
        return "Mode:" in four_letter_word(self.client_port, "srvr")

    def mode(self) -> str | None:
        for line in four_letter_word(self.client_port, "srvr").splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return None

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.serving():
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.process.returncode}:\n{self.read_log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper on {self.connect} not serving after {timeout}s:\n{self.read_log()}")
            time.sleep(0.05)

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.running():
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.paused = False
        _running.discard(self)

    def stop(self, timeout: float = 20.0) -> None:
        if self.running():
            if self.paused:
                self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _running.discard(self)

    def restart(self, *, crash: bool = True, wait: bool = True) -> "ZooKeeperServer":
        """kill -9 (or stop) and start again on the same ports and data dir."""
        self.kill() if crash else self.stop()
        return self.start(wait=wait)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets but answers nothing."""
        if self.running():
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.running():
            os.kill(self.process.pid, signal.SIGCONT)
            self.paused = False


class ZooKeeperEnsemble:
    """N servers in one quorum on loopback; `connect` names them all."""

    def __init__(self, root: Path, size: int = 3, *, tick_ms: int = 100):
        self.root = Path(root)
        quorum = [(i, free_port(), free_port()) for i in range(1, size + 1)]
        self.servers = [ZooKeeperServer(self.root / f"zk{i}", free_port(), my_id=i, quorum=quorum, tick_ms=tick_ms)
                        for i, _, _ in quorum]

    @property
    def connect(self) -> str:
        return ",".join(s.connect for s in self.servers)

    def start(self, timeout: float = 90.0) -> "ZooKeeperEnsemble":
        for server in self.servers:
            server.start(wait=False)
        for server in self.servers:
            server.wait_serving(timeout)
        return self

    def leader(self, timeout: float = 60.0) -> ZooKeeperServer:
        deadline = time.monotonic() + timeout
        while True:
            for server in self.servers:
                if server.running() and not server.paused and server.mode() == "leader":
                    return server
            if time.monotonic() > deadline:
                raise RuntimeError("no ZooKeeper leader elected")
            time.sleep(0.05)

    def stop(self) -> None:
        for server in self.servers:
            server.kill()


@contextlib.contextmanager
def zookeeper(*, tick_ms: int = 100, root: str | Path | None = None) -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper on a free loopback port for the duration of the block."""
    owned = root is None
    base = Path(tempfile.mkdtemp(prefix="ottla-zk-")) if owned else Path(root)
    server = None
    try:
        for _ in range(3):  # the free port may be taken between choosing and binding it
            server = ZooKeeperServer(base, free_port(), tick_ms=tick_ms)
            try:
                server.start()
                break
            except RuntimeError:
                server.kill()
                if "Address already in use" not in server.read_log():
                    raise
        yield server
    finally:
        if server is not None:
            server.kill()
        if owned:
            shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def zookeeper_ensemble(size: int = 3, *, tick_ms: int = 100,
                       root: str | Path | None = None) -> Iterator[ZooKeeperEnsemble]:
    owned = root is None
    base = Path(tempfile.mkdtemp(prefix="ottla-zkens-")) if owned else Path(root)
    ensemble = ZooKeeperEnsemble(base, size, tick_ms=tick_ms)
    try:
        yield ensemble.start()
    finally:
        ensemble.stop()
        if owned:
            shutil.rmtree(base, ignore_errors=True)
