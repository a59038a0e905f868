"""The demo's Spark Structured Streaming query, run as its own process so the demo can kill it for real.

    python -m ottla.demo.query --bootstrap HOST:PORT --checkpoint DIR [--max-offsets N] [--delivery G]

It reads the payments topic read_committed, enriches each payment (`enrich`) and writes the result
exactly-once to the enriched topic. It prints one `PROGRESS {json}` line per finished micro-batch on
stdout, and stops the query cleanly when a line arrives on stdin or stdin closes (the demo's parent
died): a SIGKILL is the only way it ends without committing what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

INPUT_TOPIC = "payments"
OUTPUT_TOPIC = "payments-enriched"
PROGRESS = "PROGRESS "
PAYMENT_SCHEMA = "id STRING, account STRING, amount_cents BIGINT, currency STRING"
MIN_TASKS = 4  # one per input partition

# Fee: 1.5% rounded half up, plus 30 cents. Band by amount. `source` says where the payment was read.
_ENRICHED = """to_json(named_struct(
    'id', p.id,
    'account', p.account,
    'currency', p.currency,
    'amount', format_string('%d.%02d', p.amount_cents DIV 100, p.amount_cents % 100),
    'fee_cents', (p.amount_cents * 15 + 500) DIV 1000 + 30,
    'net_cents', p.amount_cents - ((p.amount_cents * 15 + 500) DIV 1000 + 30),
    'band', CASE WHEN p.amount_cents < 1000 THEN 'small'
                 WHEN p.amount_cents < 100000 THEN 'medium' ELSE 'large' END,
    'source', format_string('%s-%d@%d', topic, partition, offset)))"""


def enrich(payments):
    """One enriched record per payment, keyed by the payment id: stateless, so a replayed micro-batch
    produces exactly the rows it produced the first time."""
    from pyspark.sql.functions import col, from_json

    parsed = payments.select(from_json(col("value").cast("string"), PAYMENT_SCHEMA).alias("p"),
                             "topic", "partition", "offset")
    return parsed.selectExpr("p.id AS key", f"{_ENRICHED} AS value")


def spark_session(app_name: str, conf: dict | None = None, python: str | None = None):
    """local[2,3]: two cores, and a failed task gets retried as on a cluster. Quiet: no progress bar,
    no UI, errors only. `conf`: more Spark settings (the benchmarks try some). `python`: the Python workers'
    interpreter (a benchmark measures a user's venv so), by default this one."""
    from pyspark.sql import SparkSession

    import ottla.spark

    os.environ["PYSPARK_PYTHON"] = python or sys.executable  # Python workers must see this venv's packages
    builder = (SparkSession.builder.master("local[2,3]").appName(app_name)
               .config("spark.sql.shuffle.partitions", 2)
               .config("spark.ui.enabled", False)
               .config("spark.ui.showConsoleProgress", False))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    ottla.spark.register(session)
    return session


def start_query(spark, bootstrap: str, checkpoint: str, max_offsets: int, trigger: dict,
                output_topic: str = OUTPUT_TOPIC, delivery: str = "exactly_once"):
    payments = (spark.readStream.format("ottla")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", INPUT_TOPIC)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", max_offsets)
                # Several write tasks per micro-batch (the source would read these small ranges in one): the
                # demo kills the query once some of a micro-batch's tasks committed and others did not.
                .option("minPartitions", MIN_TASKS)
                .load())
    return (enrich(payments).writeStream.format("ottla")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", output_topic)
            .option("deliveryGuarantee", delivery)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start())


def _report(progress) -> None:
    source = progress["sources"][0]
    line = {"batch": progress["batchId"], "rows": progress["numInputRows"],
            "ms": progress["durationMs"].get("triggerExecution", 0),
            "end": json.loads(source["endOffset"]) if source["endOffset"] else {}}
    print(PROGRESS + json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", type=int, default=2000, help="maxOffsetsPerTrigger")
    parser.add_argument("--delivery", default="exactly_once", help="the sink's deliveryGuarantee")
    args = parser.parse_args(argv)

    spark = spark_session("ottla-demo")
    query = start_query(spark, args.bootstrap, args.checkpoint, args.max_offsets,
                        {"processingTime": "500 milliseconds"}, delivery=args.delivery)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    last = None
    while query.isActive and not stop.is_set():
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != last and progress["numInputRows"]:
            _report(progress)
        last = progress["batchId"] if progress is not None else None
        time.sleep(0.1)
    if stop.is_set():
        query.stop()
        return 0
    print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
