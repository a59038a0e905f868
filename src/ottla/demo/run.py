"""`make demo`: an exactly-once pipeline through Ottla and Spark, with crashes on purpose, then verified.

1. an Ottla broker starts in a temporary directory;
2. a transactional producer writes payments to `payments`, aborting every 7th transaction;
3. a Spark query (its own process, `ottla.demo.query`) reads them read_committed, enriches each one and
   writes the result exactly-once to `payments-enriched`;
4. part-way through, the query is killed with SIGKILL (driver, JVM and Python workers) in the middle of
   a micro-batch and restarted from its checkpoint; later the broker is killed with SIGKILL and
   restarted on the same port, and any query that fails because of it is restarted too. With
   `--brokers N` (N >= 3) the demo runs on ZooKeeper and N brokers with replication factor 3 instead,
   and the broker it kills is the leader of an input partition (`brokers.py`);
5. the verifier reads both topics with plain read_committed consumers and compares the output with the
   enrichment it computes itself. Exit status 0 only if the output is exact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from ..end_offsets import list_offsets
from .brokers import deployment
from .producer import ABORT_EVERY, PaymentProducer
from .query import INPUT_TOPIC, OUTPUT_TOPIC, PROGRESS
from .verify import Report, verify

PARTITIONS = 4
TOPICS = [INPUT_TOPIC, OUTPUT_TOPIC]
MAX_UNPLANNED_RESTARTS = 5


class Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {message}", flush=True)


class QueryProcess:
    """One run of `python -m ottla.demo.query`, in its own process group so that a kill takes the
    driver, its JVM and the JVM's Python workers down together, as a crashed machine would."""

    def __init__(self, number: int, root: Path, bootstrap: str, max_offsets: int, delivery: str):
        self.number = number
        self.log_path = root / f"query-{number}.log"
        self.checkpoint = root / "checkpoint"
        self.batches: list[dict] = []
        self.killed = False
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ottla.demo.query", "--bootstrap", bootstrap,
                 "--checkpoint", str(self.checkpoint), "--max-offsets", str(max_offsets), "--delivery", delivery],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read_progress, daemon=True)
        self._reader.start()

    def _read_progress(self) -> None:
        for line in self.process.stdout:
            if line.startswith(PROGRESS):
                self.batches.append(json.loads(line[len(PROGRESS):]))

    @property
    def rows(self) -> int:
        return sum(b["rows"] for b in self.batches)

    def running(self) -> bool:
        return self.process.poll() is None

    def reached(self, ends: dict[int, int]) -> bool:
        """True once a finished micro-batch has read every partition up to `ends`."""
        if not self.batches:
            return False
        done = self.batches[-1]["end"].get(INPUT_TOPIC, {})
        return all(done.get(str(p), -1) >= offset for p, offset in ends.items())

    def kill(self) -> None:
        self.killed = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self._reader.join(5)

    def stop(self, timeout_s: float = 120.0) -> int:
        """Ask the query to stop cleanly (a line on its stdin)."""
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        self._reader.join(5)
        return code

    def failure(self) -> str:
        """The last meaningful line of the query's log, to say why it ended."""
        lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        reasons = [line for line in lines if line.startswith("query failed") or "Error" in line]
        return (reasons or lines or ["no output"])[-1][:300]


def checkpoint_state(checkpoint: Path) -> tuple[int, int]:
    """(last micro-batch in Spark's offset log, last micro-batch in its commit log); -1 if none."""
    def last(name: str) -> int:
        ids = [int(p.name) for p in (checkpoint / name).glob("[0-9]*") if p.name.isdigit()]
        return max(ids, default=-1)
    return last("offsets"), last("commits")


class OutputCounter:
    """Counts what a read_committed consumer sees in the output topic, for the progress lines."""

    def __init__(self, bootstrap: str):
        self.count = 0
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-progress", "log_level": 0,
                                   "enable.auto.commit": False, "isolation.level": "read_committed"})
        self._consumer.assign([TopicPartition(OUTPUT_TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])

    def poll(self, timeout_s: float) -> int:
        self.count += sum(1 for m in self._consumer.consume(10_000, timeout=timeout_s) if m.error() is None)
        return self.count

    def close(self) -> None:
        self._consumer.close()


def committed_ends(bootstrap: str) -> dict[int, int]:
    """The input's last stable offsets: where a query that has read everything committed stands."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    answers = list_offsets(admin, {TopicPartition(INPUT_TOPIC, p): OffsetSpec.latest() for p in range(PARTITIONS)},
                           isolation_level=IsolationLevel.READ_COMMITTED, timeout_s=30)
    return {tp.partition: info.offset for tp, info in answers.items()}


class Demo:
    def __init__(self, args: argparse.Namespace, root: Path):
        self.args = args
        self.root = root
        self.clock = Clock()
        self.brokers = deployment(args.brokers, root)
        self.queries: list[QueryProcess] = []
        self.unplanned_restarts = 0
        self.caught_up_at = 0.0
        self.max_offsets = max(200, args.events // 8)

    @property
    def query(self) -> QueryProcess:
        return self.queries[-1]

    def start_query(self, why: str) -> None:
        self.queries.append(QueryProcess(len(self.queries) + 1, self.root, self.brokers.bootstrap, self.max_offsets,
                                         self.args.delivery))
        self.clock.say(f"spark query #{self.query.number} starting ({why}), pid {self.query.process.pid}")

    def run(self) -> Report:
        say = self.clock.say
        self.brokers.start(say)
        admin = AdminClient({"bootstrap.servers": self.brokers.bootstrap, "log_level": 0})
        replicas, config = self.brokers.replication, self.brokers.topic_config
        topics = [NewTopic(t, PARTITIONS, replicas, config=config) for t in TOPICS]
        for future in admin.create_topics(topics).values():
            future.result(60)
        settings = "".join(f", {k}={v}" for k, v in config.items())
        say(f"topics {INPUT_TOPIC} -> {OUTPUT_TOPIC}, {PARTITIONS} partitions each, replication factor "
            f"{replicas}{settings}")

        self.producer = PaymentProducer(self.brokers.bootstrap, INPUT_TOPIC, self.args.events, rate=self.args.rate)
        self.lead = max(500, self.args.events * 3 // 10)
        self.producer.allowed = self.lead
        self.producer.start()
        say(f"producer: {self.args.events:,} payments, {self.producer.per_txn} per transaction, every "
            f"{ABORT_EVERY}th transaction aborted on purpose; at most {self.args.rate:.0f}/s and "
            f"{self.lead:,} ahead of the output")
        self.start_query(f"read_committed, {self.args.delivery} sink, maxOffsetsPerTrigger={self.max_offsets}")
        self.output = OutputCounter(self.brokers.bootstrap)
        try:
            self._pipeline()
        finally:
            self.output.close()
            for query in self.queries:
                if query.running():
                    query.kill()
        self.brokers.settle(say, TOPICS)
        say("verifying: reading both topics with independent read_committed consumers ...")
        return verify(self.brokers.bootstrap, INPUT_TOPIC, OUTPUT_TOPIC, self.producer.aborted_ids)

    def _pipeline(self) -> None:
        expected = self.args.events * (ABORT_EVERY - 1) / ABORT_EVERY  # about what will be committed
        deadline = time.monotonic() + self.args.timeout
        next_status = 0.0
        shown: tuple = ()
        phase, armed_at, ends, crashed_at = "kill-query", None, None, (0.0, 0)
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pipeline did not finish within {self.args.timeout:.0f}s")
            if self.producer.error is not None:
                raise RuntimeError(f"producer failed: {self.producer.error}")
            self.producer.allowed = self.output.count + self.lead
            self.output.poll(0.2)
            query = self.query
            if not query.running() and not query.killed:
                self._restart_after_failure(query)
                continue
            if time.monotonic() >= next_status:
                shown = self._status(shown)
                next_status = time.monotonic() + 3

            if phase == "kill-query" and query.rows >= 0.25 * expected:
                # Kill once part of the next micro-batch is visible in the output: some of its tasks
                # committed, Spark's commit log does not have it yet. (Or after 10 s, whatever happened.)
                armed_at = armed_at or time.monotonic()
                if self.output.count > query.rows or time.monotonic() - armed_at > 10:
                    self._kill_query(query)
                    phase = "kill-broker"
            elif phase == "kill-broker" and query.batches and self.output.count >= 0.55 * expected:
                running = "producer and query are" if self.producer.is_alive() else "the query is"
                self.brokers.crash(self.clock.say, running, TOPICS)
                phase, crashed_at = "restart-broker", (time.monotonic(), self.output.count)
            elif phase == "restart-broker":
                # Back once the pipeline has visibly carried on without it (or after 20 s, whatever happened).
                if self.brokers.restart_pending and (self.output.count >= crashed_at[1] + 0.1 * expected
                                                     or time.monotonic() - crashed_at[0] > 20):
                    self.clock.say(f"output grew by {self.output.count - crashed_at[1]:,} records while a "
                                   f"broker was down; restarting it")
                    self.brokers.restart(self.clock.say)
                if not self.brokers.restart_pending:
                    phase = "finish"
            elif phase == "finish" and not self.producer.is_alive():
                ends = ends or self._producer_done()
                if query.reached(ends):
                    self.caught_up_at = self.clock.elapsed()
                    self.clock.say(f"spark query #{query.number} has read all committed input "
                                   f"(batch {query.batches[-1]['batch']}): stopping it")
                    code = query.stop()
                    if code != 0:
                        raise RuntimeError(f"query #{query.number} did not stop cleanly (exit {code}): "
                                           f"{query.failure()}")
                    self._status()
                    return

    def _status(self, shown: tuple = ()) -> tuple:
        """Print a progress line if anything moved, or every 15 s while nothing does (Spark starting up)."""
        p, q = self.producer, self.query
        state = (p.produced, q.number, len(q.batches), self.output.count)
        if state[:4] == shown[:4] and self.clock.elapsed() - shown[4] < 15:
            return shown
        spark = (f"batch {q.batches[-1]['batch']}, {q.rows:,} rows" if q.batches
                 else "starting (JVM, Python workers)")
        self.clock.say(f"produced {p.produced:,} (committed {p.committed:,}, aborted {p.aborted + p.failed:,}) "
                       f"| spark #{q.number}: {spark} | output {self.output.count:,}")
        return (*state, self.clock.elapsed())

    def _kill_query(self, query: QueryProcess) -> None:
        say = self.clock.say
        query.kill()
        planned, committed = checkpoint_state(query.checkpoint)
        say(f">>> kill -9 spark query #{query.number} (driver, JVM and Python workers)")
        if planned > committed:
            self.output.poll(1.0)
            written = ""
            if query.batches and query.batches[-1]["batch"] == committed:  # every finished batch was reported
                written = f", and {self.output.count - query.rows:,} of its records were already in the output"
            say(f"    micro-batch {planned} was running: it is in the checkpoint's offset log, not in its "
                f"commit log{written}")
            say("    the restarted query must replay it, and its sink must not write those records again")
        else:
            say(f"    it was between micro-batches (last one, {committed}, is committed in the checkpoint)")
        self.start_query("restart from the checkpoint")

    def _restart_after_failure(self, query: QueryProcess) -> None:
        self.unplanned_restarts += 1
        self.clock.say(f"spark query #{query.number} failed (exit {query.process.returncode}): {query.failure()}")
        if self.unplanned_restarts > MAX_UNPLANNED_RESTARTS:
            raise RuntimeError(f"the query failed {self.unplanned_restarts} times; logs in {self.root}")
        self.start_query("restart from the checkpoint after the failure")

    def _producer_done(self) -> dict[int, int]:
        p = self.producer
        self.clock.say(f"producer done: {p.produced:,} payments in {p.transactions} transactions; committed "
                       f"{p.committed:,}, aborted on purpose {p.aborted:,}, aborted by failures {p.failed:,}, "
                       f"in doubt {p.in_doubt:,}")
        return committed_ends(self.brokers.bootstrap)


def table(report: Report, demo: Demo, wall_s: float) -> str:
    batches = sum(len(q.batches) for q in demo.queries)
    rows = sum(q.rows for q in demo.queries)
    batch_s = sum(b["ms"] for q in demo.queries for b in q.batches) / 1000
    # A query run's first micro-batch also starts Spark's Python workers: the later ones show the pipeline.
    later = [b for q in demo.queries for b in q.batches[1:]]
    later_s, later_rows = sum(b["ms"] for b in later) / 1000, sum(b["rows"] for b in later)
    rows = [
        ("records in (committed payments)", f"{report.records_in:,}"),
        ("records out (enriched, read_committed)", f"{report.records_out:,}"),
        ("duplicates", f"{report.duplicates:,}"),
        ("missing", f"{report.missing:,}"),
        ("aborted records that leaked", f"{report.leaked:,}"),
        ("aborted records in the input log", f"{report.aborted_in_log:,}"),
        ("wrong values", f"{report.wrong:,}"),
        ("unexpected records", f"{report.unexpected:,}"),
        ("micro-batches", f"{batches} in {len(demo.queries)} query runs"),
        ("brokers", demo.brokers.describe()),
        ("crashes", f"query killed 1x, {' and '.join(demo.brokers.kills) or 'no broker'} killed, "
                    f"query failed {demo.unplanned_restarts}x"),
        ("wall time", f"{wall_s:.1f} s"),
        ("time in micro-batches", f"{batch_s:.1f} s for {rows:,} rows, {rows / batch_s:,.0f} records/s (each "
                                  "query run's first batch also starts its Python workers)" if batch_s else "-"),
        ("later micro-batches", f"{later_s:.1f} s for {later_rows:,} rows, {later_rows / later_s:,.0f} records/s "
                                "(every query run's first left out)" if later_s else "-"),
        ("throughput end to end", f"{report.records_out / demo.caught_up_at:,.0f} records/s (output records / "
                                  f"{demo.caught_up_at:.1f} s until the query caught up, Spark start-ups included)"
         if demo.caught_up_at else "-"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def brokers_count(text: str) -> int:
    """1 (no ZooKeeper) or at least 3: replication factor 3 needs three brokers."""
    count = int(text)
    if count == 1 or count >= 3:
        return count
    raise argparse.ArgumentTypeError("1 (a single broker) or at least 3 (replication factor 3)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ottla.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="payments to produce (default 20,000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="at most this many payments per second")
    parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--delivery", choices=("exactly_once", "at_least_once"), default="exactly_once",
                        help="the sink's guarantee; at_least_once shows what the verifier finds without transactions")
    parser.add_argument("--brokers", type=brokers_count, default=1,
                        help="1 (default): one broker, killed and restarted mid-run; N >= 3: ZooKeeper and N "
                             "brokers, topics with replication factor 3, and the leader of an input partition "
                             "is killed mid-run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="ottla-demo-"))
    demo = Demo(args, root)
    print(f"Ottla demo: payments pipeline, {args.events:,} payments, Spark local[2], {args.delivery} sink, "
          f"{demo.brokers.describe()}; working dir {root}", flush=True)
    try:
        report = demo.run()
    except Exception as error:
        print(f"FAILED: {type(error).__name__}: {error}\nbroker data, checkpoint and query logs kept in {root}",
              flush=True)
        return 1
    finally:
        demo.brokers.stop()
    wall = demo.clock.elapsed()
    print("\nRESULT\n" + table(report, demo, wall), flush=True)
    for example in report.examples:
        print(f"  e.g. {example}")
    if report.exact:
        print("EXACT: every committed payment is in the output once, enriched correctly; nothing aborted leaked.")
    else:
        print(f"NOT EXACT: see the counts above; broker data, checkpoint and query logs kept in {root}")
    if report.exact and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if report.exact else 1
