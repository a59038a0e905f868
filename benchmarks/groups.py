"""Consumer group costs on one Ottla broker this script starts (group.initial.rebalance.delay.ms=0,
so the numbers show the protocol's own cost, not the delay Kafka adds on purpose).

Rebalance: 10 confluent-kafka consumer processes, each created first and then told at the same
moment to subscribe to one 20-partition topic as one group (range assignor, librdkafka's
default session.timeout.ms=45000; heartbeat.interval.ms 3000, librdkafka's default, unless
--heartbeat-ms says otherwise). "Join" is the time from the
last member's subscribe() until every member holds its final assignment (2 partitions each,
all 20 covered, taken from the on_assign callbacks); then one member close()s (LeaveGroup) and
"leave" is the time from its close() until the other 9 hold assignments covering all 20
partitions again; then one more process subscribes to the group of 9 and "scale-out" is the
time from its subscribe() until all 10 hold new assignments covering the 20. Eager
rebalancing: members learn of a rebalance from a heartbeat response, so leave and scale-out
include up to one heartbeat interval. Each round uses a fresh group.

Commits: 1 and 4 committer processes, each with its own group and partition, call
consumer.commit(offsets=[one explicit offset], asynchronous=False) in a loop for a fixed
time. The broker answers a commit only after the __consumer_offsets append is fsynced
(commits arriving together share the fsync). Each committer's last offset must read back.
Timestamps cross processes through the system-wide monotonic clock.

    .venv/bin/python benchmarks/groups.py                        # 3 rounds, 10 s per commit run, ~2 min
    .venv/bin/python benchmarks/groups.py --rounds 1 --seconds 3

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition, libversion
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, progress  # noqa: E402

MEMBERS = 10
PARTITIONS = 20
COMMIT_PARTITIONS = 4


def member(bootstrap: str, group: str, topic: str, heartbeat_ms: int, index: int, events, go, leave, stop) -> None:
    """One group member: reports ready, its subscribe time, every assignment, and its leave time."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "partition.assignment.strategy": "range",
                         "heartbeat.interval.ms": heartbeat_ms, "enable.auto.commit": False, "log_level": 0})
    events.put(("ready", index, time.monotonic(), None))
    go.wait()
    events.put(("subscribed", index, time.monotonic(), None))
    consumer.subscribe([topic], on_assign=lambda _, partitions: events.put(
        ("assigned", index, time.monotonic(), frozenset(p.partition for p in partitions))))
    while not stop.is_set():
        if leave.is_set():
            events.put(("leaving", index, time.monotonic(), None))
            break
        consumer.poll(0.05)
    consumer.close()


def committer(bootstrap: str, topic: str, index: int, seconds: float, results, go) -> None:
    """Synchronous commits of explicit offsets for `seconds`; reports count, elapsed and latencies."""
    group = f"committer-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "log_level": 0})
    partition = index % COMMIT_PARTITIONS
    consumer.commit(offsets=[TopicPartition(topic, partition, 0)], asynchronous=False)  # finds the coordinator
    results.put(("ready", index))
    go.wait()
    latencies = []
    offset = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        offset += 1
        before = time.perf_counter()
        consumer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
        latencies.append(time.perf_counter() - before)
    elapsed = time.monotonic() - started
    read_back = consumer.committed([TopicPartition(topic, partition)], timeout=30)[0].offset
    consumer.close()
    results.put(("done", index, offset, elapsed, latencies, read_back))


def _collect(events, assigned: dict, stamps: dict, done, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"group did not settle in {timeout:.0f}s; assignments {assigned}")
        try:
            kind, index, stamp, partitions = events.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if kind == "assigned":
            assigned[index] = (stamp, partitions)
        else:
            stamps[kind, index] = stamp


def rebalance_round(context, admin: AdminClient, bootstrap: str, topic: str,
                    heartbeat_ms: int) -> tuple[float, float, float]:
    """(join, leave, scale-out join) seconds for one fresh group: MEMBERS members subscribe at
    once, one of them closes, then one more member joins the remaining MEMBERS - 1."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    events, go, go_late, stop = context.Queue(), context.Event(), context.Event(), context.Event()
    leaves = [context.Event() for _ in range(MEMBERS + 1)]
    procs = [context.Process(target=member, args=(bootstrap, group, topic, heartbeat_ms, i, events,
                                                  go if i < MEMBERS else go_late, leaves[i], stop), daemon=True)
             for i in range(MEMBERS + 1)]
    for proc in procs:
        proc.start()
    assigned: dict[int, tuple[float, frozenset]] = {}
    stamps: dict[tuple[str, int], float] = {}

    def settled(members: set[int], since: float = 0.0) -> bool:
        held = [assigned[m] for m in members if m in assigned]
        partitions = [p for _, ps in held for p in ps]
        return (len(held) == len(members) and all(stamp > since for stamp, _ in held)
                and sorted(partitions) == list(range(PARTITIONS)))

    try:
        _collect(events, assigned, stamps, lambda: sum(k == "ready" for k, _ in stamps) == MEMBERS + 1, 120)
        go.set()
        first = set(range(MEMBERS))
        _collect(events, assigned, stamps, lambda: all(("subscribed", m) in stamps for m in first)
                 and settled(first) and all(len(assigned[m][1]) == PARTITIONS // MEMBERS for m in first), 120)
        last_subscribe = max(stamps["subscribed", m] for m in first)
        join = max(assigned[m][0] for m in first) - last_subscribe
        description = admin.describe_consumer_groups([group])[group].result(30)
        if description.state.name != "STABLE" or len(description.members) != MEMBERS:
            raise RuntimeError(f"group not stable with {MEMBERS} members: {description}")

        leaver = MEMBERS - 1
        leaves[leaver].set()
        _collect(events, assigned, stamps, lambda: ("leaving", leaver) in stamps, 30)
        left_at = stamps["leaving", leaver]
        staying = first - {leaver}
        _collect(events, assigned, stamps, lambda: settled(staying, since=left_at), 120)
        leave = max(assigned[m][0] for m in staying) - left_at

        go_late.set()
        _collect(events, assigned, stamps, lambda: ("subscribed", MEMBERS) in stamps, 30)
        joined_at = stamps["subscribed", MEMBERS]
        grown = staying | {MEMBERS}
        _collect(events, assigned, stamps, lambda: settled(grown, since=joined_at), 120)
        scale_out = max(assigned[m][0] for m in grown) - joined_at
        return join, leave, scale_out
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def commit_run(context, bootstrap: str, topic: str, committers: int, seconds: float) -> dict:
    results, go = context.Queue(), context.Event()
    procs = [context.Process(target=committer, args=(bootstrap, topic, i, seconds, results, go), daemon=True)
             for i in range(committers)]
    for proc in procs:
        proc.start()
    try:
        ready = 0
        while ready < committers:
            ready += results.get(timeout=120)[0] == "ready"
        go.set()
        done = [results.get(timeout=seconds + 120) for _ in range(committers)]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    for _, index, offset, _, _, read_back in done:
        if read_back != offset:
            raise RuntimeError(f"committer {index} committed {offset} but reads back {read_back}")
    commits = sum(d[2] for d in done)
    latencies = sorted(x for d in done for x in d[4])
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return {"commits": commits, "rate": commits / max(d[3] for d in done), "p50": latencies[len(latencies) // 2],
            "p99": p99}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rebalance rounds and commit runs per setting")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one commit run")
    parser.add_argument("--heartbeat-ms", type=int, default=3000, help="members' heartbeat.interval.ms")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")

    load_before = os.getloadavg()
    started = time.monotonic()
    joins, leaves, scale_outs = [], [], []
    commit_runs: dict[int, list[dict]] = {1: [], 4: []}
    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-bench-groups-") as workdir:
        broker = Ottla(children, Path(workdir) / "data", ["--config", "group.initial.rebalance.delay.ms=0"])
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        topics = [NewTopic("rebalance", PARTITIONS, 1), NewTopic("commits", COMMIT_PARTITIONS, 1)]
        for future in admin.create_topics(topics).values():
            future.result(30)
        for round_ in range(args.rounds):
            join, leave, scale_out = rebalance_round(context, admin, broker.bootstrap, "rebalance", args.heartbeat_ms)
            joins.append(join)
            leaves.append(leave)
            scale_outs.append(scale_out)
            progress(f"rebalance round {round_ + 1}/{args.rounds}: join {join:.2f} s, leave {leave:.2f} s, "
                     f"scale-out {scale_out:.2f} s")
        for round_ in range(args.rounds):
            for committers in (1, 4) if round_ % 2 == 0 else (4, 1):
                result = commit_run(context, broker.bootstrap, "commits", committers, args.seconds)
                commit_runs[committers].append(result)
                progress(f"commit run {round_ + 1}/{args.rounds}, {committers} committer(s): "
                         f"{result['rate']:,.0f} commits/s")
        broker.stop()
    load_after = os.getloadavg()

    print(f"{MEMBERS} members, {PARTITIONS} partitions, group.initial.rebalance.delay.ms=0, "
          f"heartbeat.interval.ms={args.heartbeat_ms}, "
          f"librdkafka {libversion()[0]}, {os.cpu_count()} CPUs, median of {args.rounds} round(s); "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"took {time.monotonic() - started:.0f} s\n")
    print("| measurement | median | min | max |")
    print("| --- | ---: | ---: | ---: |")
    for name, samples in (("join: 10 subscribe at once, last subscribe to all 10 assigned (s)", joins),
                          ("leave: one close()s, to the other 9 reassigned (s)", leaves),
                          ("scale-out: a 10th subscribes to a stable 9, to all 10 assigned (s)", scale_outs)):
        print(f"| {name} | {statistics.median(samples):.2f} | {min(samples):.2f} | {max(samples):.2f} |")
    for committers, runs in commit_runs.items():
        rates = [r["rate"] for r in runs]
        plural = "s" * (committers > 1)
        print(f"| commits/s, {committers} synchronous committer{plural} | {statistics.median(rates):,.0f} "
              f"| {min(rates):,.0f} | {max(rates):,.0f} |")
    for committers, runs in commit_runs.items():
        plural = "s" * (committers > 1)
        p50 = statistics.median(r["p50"] for r in runs) * 1000
        p99 = statistics.median(r["p99"] for r in runs) * 1000
        print(f"| commit latency p50 / p99, {committers} committer{plural} (ms) | {p50:.2f} / {p99:.2f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
