"""How long `ottla serve` takes to start: from launching the process until its --ready-file
appears (interpreter start, imports, building Broker(), opening the logs, listening), the CPU
time the process had used by then, the broker's own "started in" figure, and, in separate
runs under `python -X importtime`, the time its imports took and how many modules it loaded.

Each --src is a source tree (what PYTHONPATH points at); their runs are interleaved, so a
before/after comparison sees the same machine. The data dir is made once per source tree by a
first start (the internal topics, 100 partitions), or copied from --data-dir (e.g. a stormed
one from commit_storm.py) and restarted --runs times. Bytecode is cached, as an installed
package has it.

With --partitions N each tree's broker makes a data dir holding a topic of N partitions with
--records records each (idempotent producer), shut down cleanly; then restarts it, produces
--records more to each partition and is killed with SIGKILL, so the recovery-point checkpoint
lies inside every active segment, as after any kill -9 of a broker that had restarted once
(each tree's own, as its crash leaves the files). Both are timed: "clean" restarts the clean
data dir each run, "kill -9" starts a fresh copy of the crashed one each run (the copy is not
timed). cProfile's top costs of opening that data dir's
logs (`LogManager(...)` in-process, on fresh copies) are printed after the table.

    .venv/bin/python benchmarks/startup.py --src before=/tmp/before/src --src after=src --runs 10
    .venv/bin/python benchmarks/startup.py --src src --data-dir /tmp/stormed --config offsets.topic.num.partitions=1
    .venv/bin/python benchmarks/startup.py --src before=/tmp/before/src --src after=src --partitions 1000 --runs 5

Results table (Markdown) on stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """utime + stime of a running process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_once(env: dict[str, str], data_dir: Path, extra: list[str], importtime: bool) -> dict[str, float]:
    """One start until the ready file appears, then SIGTERM and wait for a clean stop."""
    ready = data_dir.parent / f"{data_dir.name}.ready"
    ready.unlink(missing_ok=True)
    stderr = data_dir.parent / f"{data_dir.name}.err"
    command = [sys.executable] + (["-X", "importtime"] if importtime else []) + [
        "-m", "ottla.cli", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0",
        "--ready-file", str(ready)] + extra
    with open(stderr, "w") as err:
        launched = time.monotonic()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"ottla serve exited with {proc.returncode}: see {stderr}")
            time.sleep(0.002)
        result = {"ready_s": time.monotonic() - launched, "cpu_s": cpu_seconds(proc.pid)}
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    lines = stderr.read_text(errors="replace").splitlines()
    for line in lines:
        if "(started in " in line:
            result["started_s"] = float(line.rpartition("(started in ")[2].split()[0])
    if importtime:
        selfs = [int(line.split("|")[0].split(":")[1]) for line in lines
                 if line.startswith("import time:") and "self [us]" not in line]
        result = {"imports_s": sum(selfs) / 1e6, "modules": float(len(selfs))}
    return result


def make_partitioned(env: dict[str, str], root: Path, partitions: int, records: int) -> tuple[Path, Path]:
    """The --partitions data dirs: (shut down cleanly, killed with SIGKILL after a restart)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    root.mkdir()
    clean, crashed = root / "partitioned-clean", root / "partitioned-crashed"

    def serve(data_dir: Path) -> tuple[subprocess.Popen, str]:
        ready = root / "partitioned.ready"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "ottla.cli", "serve", "--data-dir", str(data_dir), "--listen",
                                 "127.0.0.1:0", "--ready-file", str(ready)], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(root / "partitioned.err", "a"))
        while not ready.exists() or not ready.read_text().strip():
            if proc.poll() is not None:
                raise RuntimeError(f"ottla serve exited with {proc.returncode}: see {root / 'partitioned.err'}")
            time.sleep(0.05)
        return proc, ready.read_text().split()[0]

    def produce(bootstrap: str, round_: int) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "log_level": 0})
        for i in range(records):
            for p in range(partitions):
                producer.produce("startup", value=b"v" * 100, key=f"{round_}-{i}".encode(), partition=p)
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError("records left unacknowledged")

    proc, bootstrap = serve(clean)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("startup", partitions, 1)])["startup"].result(300)
        produce(bootstrap, 0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        shutil.copytree(clean, crashed)
        proc, bootstrap = serve(crashed)
        produce(bootstrap, 1)
    finally:
        proc.kill()
        proc.wait()
    return clean, crashed


PROFILE = """
import cProfile, pstats, sys
from ottla.config import BrokerConfig
from ottla.log.manager import LogManager
profile = cProfile.Profile()
profile.enable()
manager = LogManager(sys.argv[1], BrokerConfig())
profile.disable()
print(f"{len(manager.logs)} logs opened")
pstats.Stats(profile).sort_stats("tottime").print_stats(int(sys.argv[2]))
"""


def profile_open(env: dict[str, str], data_dir: Path, root: Path, top: int) -> str:
    """cProfile of `LogManager(data_dir)` in a fresh interpreter, on a copy (recovery rewrites)."""
    copy = root / "profiled"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data_dir, copy)
    out = subprocess.run([sys.executable, "-c", PROFILE, str(copy), str(top)], env=env, check=True,
                         capture_output=True, text=True).stdout
    shutil.rmtree(copy)
    return out


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} / {max(values):.{digits}f}"


def _tree_envs(args: argparse.Namespace, root: Path) -> list[tuple[str, dict[str, str]]]:
    """(label, environment) of each `--src` tree: its PYTHONPATH and a bytecode cache of its own."""
    trees = [(src.partition("=")[0], src.partition("=")[2]) if "=" in src else (src, src) for src in args.src]
    envs = []
    for i, (label, path) in enumerate(trees):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(Path(path).resolve()), PYTHONPYCACHEPREFIX=str(root / f"pycache{i}"))
        envs.append((label, env))
    return envs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, metavar="[LABEL=]PATH",
                        help="a source tree to put on PYTHONPATH (repeatable: runs are interleaved)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--data-dir", type=Path, help="copy this data dir (not changed) and restart it")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--partitions", type=int, help="time a data dir of this many partitions, clean and kill -9")
    parser.add_argument("--records", type=int, default=3, help="records per partition and round (--partitions)")
    parser.add_argument("--profile-top", type=int, default=25, help="cProfile lines per tree and case (--partitions)")
    args = parser.parse_args()
    if args.partitions:
        partitioned(args)
        return
    extra = [item for value in args.config for item in ("--config", value)]
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ottla-startup-") as tmp:
        root = Path(tmp)
        trees = _tree_envs(args, root)
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        setups = []
        for i, (label, env) in enumerate(trees):
            data_dir = root / f"data{i}"
            if args.data_dir:
                shutil.copytree(args.data_dir, data_dir)
            start_once(env, data_dir, extra, importtime=False)  # warms the bytecode cache, makes the data dir
            setups.append((label, env, data_dir))
        for run in range(args.runs):
            for label, env, data_dir in setups:
                timed = start_once(env, data_dir, extra, importtime=False)
                timed.update(start_once(env, data_dir, extra, importtime=True))
                results[label].append(timed)
                print(f"{label} run {run + 1}: {timed}", file=sys.stderr)
            load.append(os.getloadavg()[0])
    print("| code | runs | launch to ready file s | CPU at ready s | broker's 'started in' s | imports s (-X importtime) | modules imported |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, runs in results.items():
        print(f"| {label} | {len(runs)} | {spread([r['ready_s'] for r in runs])} | {spread([r['cpu_s'] for r in runs])} | "
              f"{spread([r['started_s'] for r in runs])} | {spread([r['imports_s'] for r in runs])} | "
              f"{statistics.median([r['modules'] for r in runs]):.0f} |")
    print()
    print("- each cell: median / max")
    print(f"- {os.cpu_count()} CPUs; load average {min(load):.1f}-{max(load):.1f} (`os.getloadavg`, before and after each round)")
    print("- command: python benchmarks/startup.py " + " ".join(sys.argv[1:]))


def partitioned(args: argparse.Namespace) -> None:
    """--partitions: clean and kill -9 restarts of one data dir, every tree on copies of it."""
    extra = [item for value in args.config for item in ("--config", value)]
    load = [os.getloadavg()[0]]
    cases = ("clean", "kill -9")
    with tempfile.TemporaryDirectory(prefix="ottla-startup-") as tmp:
        root = Path(tmp)
        setups = _tree_envs(args, root)
        results: dict[tuple[str, str], list[dict[str, float]]] = {(c, label): [] for c in cases for label, _ in setups}
        made = []
        for i, (label, env) in enumerate(setups):
            print(f"{label}: making {args.partitions} partitions x {args.records} records", file=sys.stderr)
            made.append(make_partitioned(env, root / f"tree{i}", args.partitions, args.records))
            start_once(env, made[i][0], extra, importtime=False)  # warms the bytecode cache
        for run in range(args.runs):
            for i, (label, env) in enumerate(setups):
                results[("clean", label)].append(start_once(env, made[i][0], extra, importtime=False))
                copy = root / f"crashed{i}"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(made[i][1], copy)
                results[("kill -9", label)].append(start_once(env, copy, extra, importtime=False))
                print(f"{label} run {run + 1}: clean {results[('clean', label)][-1]}, "
                      f"kill -9 {results[('kill -9', label)][-1]}", file=sys.stderr)
            load.append(os.getloadavg()[0])
        profiles = [(case, label, profile_open(env, data_dir, root, args.profile_top))
                    for (label, env), dirs in zip(setups, made) for case, data_dir in zip(("clean", "kill -9"), dirs)]
    print("| restart | code | runs | launch to ready file s | CPU at ready s | broker's 'started in' s |")
    print("|---|---|---:|---:|---:|---:|")
    for (case, label), runs in results.items():
        print(f"| {case} | {label} | {len(runs)} | {spread([r['ready_s'] for r in runs])} | "
              f"{spread([r['cpu_s'] for r in runs])} | {spread([r['started_s'] for r in runs])} |")
    print()
    print(f"- {args.partitions} partitions x {args.records} records (+{args.records} before the kill -9); "
          "each cell: median / max")
    print(f"- {os.cpu_count()} CPUs; load average {min(load):.1f}-{max(load):.1f} (`os.getloadavg`, before and after each round)")
    print("- command: python benchmarks/startup.py " + " ".join(sys.argv[1:]))
    for case, label, text in profiles:
        print(f"\n### cProfile of LogManager(): {case}, {label}\n\n```")
        print("\n".join(line for line in text.strip().splitlines()[:args.profile_top + 12]))
        print("```")


if __name__ == "__main__":
    main()
