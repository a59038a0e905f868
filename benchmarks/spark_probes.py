"""What `spark_pipeline.py` measures beside the wall clock: CPU and run-queue waits of process trees from /proc,
and the tables of `--probes` (benchmarks/spark_timing/sitecustomize.py's records of each timed call)."""

from __future__ import annotations

import collections
import json
import os
import statistics
import time


def tree_cpu(roots: list[int]) -> float:
    """User + system CPU of `roots` and all their descendants, live or reaped (from /proc)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))  # ppid; utime..cstime
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def tree_queued(roots: list[int]) -> float:
    """Run-queue wait (schedstat) of every thread of `roots` and their descendant processes, in seconds."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    total, todo = 0, list(roots)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{pid}/task/{thread}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def thread_queued(pid: int) -> float:
    """Run-queue wait (schedstat) of a process's main thread (the broker's event loop), in seconds."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def record_queued(path: str, wall: float, queued: list[float]) -> None:
    """Probe records (wall: the leg's; queued: its threads' summed run-queue wait) for the broker and Spark."""
    with open(path, "a") as out:
        for name, seconds in zip(("broker's event loop queued for a core", "broker threads queued for a core",
                                  "Spark threads queued for a core"), queued):
            out.write(json.dumps({"pid": 0, "name": name, "wall": seconds, "cpu": 0.0, "at": time.time()}) + "\n")


def take_probes(path: str) -> list[dict]:
    """The probe records written since the last call, and the file emptied."""
    with open(path) as lines:
        records = [json.loads(line) for line in lines]
    open(path, "w").close()
    return records


def leg_probe_table(n: int, size: int, probed: list[dict[str, list[dict]]], legs: list[str]) -> None:
    """Per leg and call, the calls' summed wall and CPU in each round (`--probes`)."""
    print(f"\nprobes during the legs, {n:,} rows of {size}-byte values: per call, how many and their summed wall / "
          f"CPU ms in each round (every Spark Python process; a worker's first import of a module is in the round "
          f"where it first runs a task that needs it):\n")
    print("| leg | call | " + " | ".join(f"round {i + 1}" for i in range(len(probed))) + " |")
    print("| --- | --- |" + " ---: |" * len(probed))
    for leg in legs:
        names = sorted({r["name"] for rounds in probed for r in rounds.get(leg, ())})
        for name in names:
            cells = []
            for rounds in probed:
                calls = [r for r in rounds.get(leg, ()) if r["name"] == name]
                cells.append(f"{len(calls)}: {sum(r['wall'] for r in calls) * 1000:.0f} / "
                             f"{sum(r['cpu'] for r in calls) * 1000:.0f}" if calls else "")
            print(f"| {leg} | {name} | " + " | ".join(cells) + " |")
    for index, rounds in enumerate(probed):
        for leg in legs:
            task_table(f"round {index + 1}, {leg}", rounds.get(leg, []))


# A task's own waits, by probe: the reader's for Fetch answers; the writer's for Spark's rows, for Produce
# answers (`_take`, also inside send, flush and the coordinator requests) and for the coordinator's answers.
_WAITS = {"read": ("Fetch answer",), "write": ("sink input wait", "OwnProducer._take", "txn ")}


def task_table(leg: str, records: list[dict]) -> None:
    """Per Spark task of a streaming leg (`--probes`): its reader's and writer's Python workers, when each ran
    (seconds from the leg's first read or write), wall, CPU, time queued for a core, and the waits."""
    def calls(name):
        return [r for r in records if r["name"] == name and "task" in r]

    reads = calls("StreamReader.read") + calls("ceiling read")
    writes = calls("StreamWriter.write") + calls("ceiling write")
    if not reads and not writes:
        return
    zero = min(r["at"] - r["wall"] for r in reads + writes)
    print(f"\n{leg}: per task, seconds from its first read or write (reader / writer: pid, start-end, wall, CPU, "
          f"queued for a core; waits)\n")
    print("| task | reader | reader waits: Fetch answers (n) | writer | writer waits: Spark's rows, Produce answers "
          "(n), coordinator (n) |")
    print("| ---: | --- | --- | --- | --- |")

    def span(r):
        return (f"{r['pid']}: {r['at'] - r['wall'] - zero:.2f}-{r['at'] - zero:.2f}, {r['wall']:.2f} / "
                f"{r['cpu']:.2f} / {r.get('queued', 0):.2f}")

    def waited(r, prefix):  # the probes of this process within the call, by name prefix
        inside = [q for q in records if q["pid"] == r["pid"] and q["name"].startswith(prefix)
                  and r["at"] - r["wall"] <= q["at"] - q["wall"] and q["at"] <= r["at"] + 1e-3]
        return f"{sum(q['wall'] for q in inside):.2f} ({len(inside)})"

    for task in sorted({r["task"] for r in reads + writes}):
        cells = []
        for kind, rs in (("read", reads), ("write", writes)):
            mine = [r for r in rs if r["task"] == task]
            cells.append("; ".join(span(r) for r in mine))
            cells.append("; ".join(", ".join(waited(r, p) for p in _WAITS[kind]) for r in mine))
        print(f"| {task} | " + " | ".join(cells) + " |")


def probe_table(path: str, batches: int) -> None:
    """Medians of the probes' calls (see spark_timing/sitecustomize.py), and their total per micro-batch."""
    calls = collections.defaultdict(list)
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            calls[record["name"]].append((record["wall"], record["cpu"]))
    print(f"\nprobes (every call during the two fixed-cost queries, start and first micro-batch included; "
          f"per batch = total / {batches}):\n")
    print("| call | calls | median wall ms | median CPU ms | wall ms per batch | CPU ms per batch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, times in sorted(calls.items()):
        walls, cpus = [w for w, _ in times], [c for _, c in times]
        print(f"| {name} | {len(times)} | {statistics.median(walls) * 1000:.1f} | {statistics.median(cpus) * 1000:.1f} "
              f"| {sum(walls) * 1000 / batches:.1f} | {sum(cpus) * 1000 / batches:.1f} |")
