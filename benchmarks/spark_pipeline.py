"""Records/s through the demo's pipeline (read_committed -> enrich -> exactly-once write) on local[2],
and what each micro-batch costs on top of its records.

    .venv/bin/python benchmarks/spark_pipeline.py                       # 20,000 payments, 3 batch sizes
    .venv/bin/python benchmarks/spark_pipeline.py --events 50000 --batch-sizes 2000,50000

The input is written once (transactions of 100 payments, every 7th aborted, as in `make demo`). Each
batch size then runs the same `trigger(availableNow=True)` query into a fresh output topic with a
fresh checkpoint, in one SparkSession that a warm-up run has already started the Python workers of.
Per run: micro-batches, the Spark-reported time of each (triggerExecution), records/s over the sum of
those times. The fixed cost per micro-batch is fitted from the runs: time = batches x overhead + rows x
cost per row. Every run's output is checked with the demo's verifier (read_committed consumer): a run
that is not exact fails the benchmark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

import ottla.testing
from ottla.demo import query as pipeline
from ottla.demo.producer import PaymentProducer
from ottla.demo.verify import compare, read_all, wait_until_stable

PARTITIONS = 4


def run_case(spark, bootstrap: str, admin: AdminClient, max_offsets: int, label: str) -> dict:
    output = f"enriched-{label}"
    admin.create_topics([NewTopic(output, PARTITIONS, 1)])[output].result(30)
    with tempfile.TemporaryDirectory(prefix="ottla-bench-") as checkpoint:
        started = time.monotonic()
        query = pipeline.start_query(spark, bootstrap, checkpoint, max_offsets, {"availableNow": True},
                                     output_topic=output)
        query.awaitTermination()
        wall = time.monotonic() - started
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000) for p in query.recentProgress
                   if p["numInputRows"]]
    wait_until_stable(bootstrap, output)
    report = compare(pipeline.INPUT_TOPIC, read_all(bootstrap, pipeline.INPUT_TOPIC), set(),
                     read_all(bootstrap, output))
    if not report.exact:
        raise RuntimeError(f"{label}: output not exact: {report}")
    rows = sum(r for r, _ in batches)
    seconds = sum(s for _, s in batches)
    return {"max_offsets": max_offsets, "batches": len(batches), "rows": rows, "seconds": seconds, "wall": wall,
            "per_batch": statistics.mean(s for _, s in batches), "rate": rows / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="payments in the input (default 20,000)")
    parser.add_argument("--batch-sizes", default="1000,5000,25000",
                        help="maxOffsetsPerTrigger of each run, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    load_before = os.getloadavg()[0]
    started = time.monotonic()

    with ottla.testing.broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(pipeline.INPUT_TOPIC, PARTITIONS, 1)])[pipeline.INPUT_TOPIC].result(30)
        producer = PaymentProducer(broker.bootstrap, pipeline.INPUT_TOPIC, args.events, rate=1e9)
        producer.run()
        if producer.error:
            raise producer.error
        print(f"input: {producer.committed:,} committed payments, {producer.aborted:,} aborted", file=sys.stderr)
        spark = pipeline.spark_session("ottla-bench")
        run_case(spark, broker.bootstrap, admin, args.events, "warm-up")  # starts the Python workers
        results = []
        for size in sizes:
            results.append(run_case(spark, broker.bootstrap, admin, size, f"max{size}"))
            print(f"maxOffsetsPerTrigger={size}: done", file=sys.stderr)
        spark.stop()

    print("| maxOffsetsPerTrigger | micro-batches | records | s per micro-batch | s in micro-batches | wall s | records/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['max_offsets']:,} | {r['batches']} | {r['rows']:,} | {r['per_batch']:.2f} | {r['seconds']:.1f} "
              f"| {r['wall']:.1f} | {r['rate']:,.0f} |")
    most, fewest = max(results, key=lambda r: r["batches"]), min(results, key=lambda r: r["batches"])
    if most["batches"] > fewest["batches"]:
        overhead = (most["seconds"] - fewest["seconds"]) / (most["batches"] - fewest["batches"])
        per_row = (fewest["seconds"] - fewest["batches"] * overhead) / fewest["rows"]
        print(f"\n- fixed cost per micro-batch: {overhead:.2f} s; per record: {per_row * 1e6:.0f} us "
              f"(fitted from the {most['batches']}- and {fewest['batches']}-batch runs)")
    print("- records: committed payments read read_committed, enriched, written exactly-once; every run verified")
    print(f"- {os.cpu_count()} CPUs, Spark local[2]; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; run took {time.monotonic() - started:.0f}s")
    print(f"- command: python benchmarks/spark_pipeline.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
