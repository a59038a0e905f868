"""Memory with many idle partitions, and restart time with them on disk.

Starts `ottla serve` on a free port with a fresh data dir, creates TOPICS x PARTITIONS
partitions (default 10 x 100 = 1,000) with the confluent-kafka AdminClient, lets the broker idle
and reports its RSS (target: < 150 MB). Then stops it with SIGTERM and starts it again on the
same data dir, timing until it answers Metadata and until all partitions have a leader again.

    .venv/bin/python benchmarks/idle_partitions.py
    .venv/bin/python benchmarks/idle_partitions.py --topics 20 --partitions 100 --idle 30

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Ottla, progress, rss_mib  # noqa: E402

RSS_TARGET_MB = 150


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.create_topics([NewTopic(t, partitions, 1) for t in topics], request_timeout=120)
    for future in futures.values():
        future.result(180)


def wait_for_leaders(bootstrap: str, topics: list[str], partitions: int, timeout: float) -> float:
    """Seconds until every partition of `topics` reports a leader in Metadata."""
    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    ready = 0
    while True:
        try:
            meta = admin.list_topics(timeout=5).topics
            ready = sum(
                1
                for t in topics
                if t in meta and meta[t].error is None
                for p in meta[t].partitions.values()
                if p.leader >= 0
            )
            if ready == len(topics) * partitions:
                return time.monotonic() - started
        except KafkaException:  # still coming up
            pass
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"only {ready} of {len(topics) * partitions} partitions ready after {timeout:.0f}s")
        time.sleep(0.2)


def idle_rss(pid: int, seconds: float) -> tuple[float, float]:
    """Sample RSS once a second while the broker idles: (last, highest) in MiB."""
    highest = last = rss_mib(pid)[0]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(1)
        last = rss_mib(pid)[0]
        highest = max(highest, last)
    return last, highest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100, help="partitions per topic")
    parser.add_argument("--idle", type=float, default=10, help="seconds to idle before reading RSS")
    parser.add_argument("--timeout", type=float, default=300, help="limit for each wait")
    parser.add_argument("--ottla-arg", action="append", default=[],
                        help="extra argument for `ottla serve` (repeatable)")
    args = parser.parse_args()

    topics = [f"idle-{i:03d}" for i in range(args.topics)]
    total = args.topics * args.partitions
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="ottla-idle-") as tmp, Children() as children:
        ottla = Ottla(children, Path(tmp) / "data", args.ottla_arg)
        progress(f"starting ottla on {ottla.bootstrap}")
        rows.append(("start-up, empty data dir", f"{ottla.start(args.timeout):.2f} s", ""))
        rows.append(("RSS, no topics", f"{rss_mib(ottla.proc.pid)[0]:.0f} MiB", ""))

        progress(f"creating {args.topics} topics x {args.partitions} partitions")
        started = time.monotonic()
        create_topics(ottla.bootstrap, topics, args.partitions)
        wait_for_leaders(ottla.bootstrap, topics, args.partitions, args.timeout)
        rows.append((f"create {total:,} partitions", f"{time.monotonic() - started:.2f} s", ""))

        progress(f"idling {args.idle:.0f}s")
        last, highest = idle_rss(ottla.proc.pid, args.idle)
        verdict = "ok" if last * 2**20 / 1e6 < RSS_TARGET_MB else "over"
        rows.append((f"RSS, {total:,} idle partitions", f"{last:.0f} MiB (max {highest:.0f})",
                     f"< {RSS_TARGET_MB} MB: {verdict}"))

        progress("stopping with SIGTERM")
        rows.append(("shutdown (SIGTERM to exit)", f"{ottla.stop():.2f} s", f"exit code {ottla.proc.returncode}"))

        progress("restarting on the same data dir")
        answered = ottla.start(args.timeout)
        leaders = answered + wait_for_leaders(ottla.bootstrap, topics, args.partitions, args.timeout)
        rows.append(("restart until Metadata answers", f"{answered:.2f} s", ""))
        rows.append((f"restart until all {total:,} partitions have leaders", f"{leaders:.2f} s", ""))
        last, highest = idle_rss(ottla.proc.pid, args.idle)
        rows.append((f"RSS after restart, {total:,} idle partitions", f"{last:.0f} MiB (max {highest:.0f})", ""))
        ottla.stop()

    print("| measurement | value | target |")
    print("|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"- command: {shlex.join(['python', 'benchmarks/idle_partitions.py', *sys.argv[1:]])}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        progress("interrupted")
        sys.exit(130)
