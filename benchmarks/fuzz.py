"""Structure-aware fuzzing of a real broker (issue 11): every API and version it advertises,
valid and damaged, from several connections, next to a bystander producer and consumer.

    .venv/bin/python benchmarks/fuzz.py --frames 100000 --workers 4 --seed 1

Prints a table; exits 1 if the broker died, a connection went silent (no answer and no close
within --timeout), a damaged batch inside a valid Produce was not refused with Kafka's code,
the bystander's data was not byte-exact or the restart after failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from ottla.testing.fuzz import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a connection counts as silent")
    parser.add_argument("--config", action="append", default=[], help="broker config KEY=VALUE")
    args = parser.parse_args()
    config = dict(item.split("=", 1) for item in args.config)
    report = run(args.frames, seed=args.seed, workers=args.workers, timeout_s=args.timeout, config=config,
                 progress=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True))
    rows = [
        ("frames sent", report.frames),
        ("answered (connection kept working)", report.answered),
        ("closed by the broker", report.closed),
        ("silent dead connections", len(report.silent)),
        ("broker died", report.broker_died),
        ("peak broker RSS (MiB)", f"{report.peak_rss_bytes / 2**20:.0f}"),
        ("worst event-loop lag, wall clock (ms)", report.worst_lag_ms),
        ("worst event-loop lag, loop's own CPU (ms)", report.worst_lag_cpu_ms),
        ("handler failures (closed, one log line)", sum(report.handler_failures.values())),
        ("hostile batches not refused as Kafka does", len(report.wrong_batch_answers)),
        ("bystander records", report.bystander_sent),
        ("bystander byte-exact", report.bystander_exact),
        ("bystander", report.bystander_detail),
        ("clean restart after", report.restarted_cleanly),
        ("wall time (s)", f"{report.seconds:.0f}"),
        ("frames/s", f"{report.frames / report.seconds:.0f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print("mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(report.kinds.items())))
    print("hostile batches: " + ", ".join(f"{k} {v}" for k, v in sorted(report.batch_answers.items())))
    for wrong in report.wrong_batch_answers[:10]:
        print(f"hostile batch not refused as Kafka does: {wrong}")
    for what, count in report.handler_failures.most_common():
        print(f"handler failure: {what} x{count}")
    print(f"longest single steps (one request's code between two awaits, loop CPU): {report.longest_steps}")
    print(f"longest garbage collections: {report.longest_gc}")
    for line in report.lag_context:
        print(f"before the worst lag: {line}")
    for frame in report.silent[:10]:
        print(f"silent after: {frame}")
    ok = (not report.broker_died and not report.silent and report.bystander_exact and report.restarted_cleanly
          and not report.wrong_batch_answers)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
