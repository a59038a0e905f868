"""Exactly-once copier with kafka-python, run as its own process: consume-transform-produce
with sendOffsetsToTransaction, as Kafka's own transactions system test runs its copier.

test_copier_cluster.py kills it with SIGKILL and bounces brokers under it. Each output record
is `copied:<input value>` on the input record's partition index, and the consumer's positions
go into the same transaction. Every `--abort-every`-th transaction is aborted on purpose after
writing `aborted:<input value>` records, so a read_committed reader has aborted records to
not see. On any error inside a transaction the copier aborts it and rewinds the consumer to
its committed offsets; an error it cannot abort from (fenced by a newer instance, ...) ends
the process with status 1, and the test starts a new one.

    python kp_copier.py BOOTSTRAP INPUT OUTPUT --group G --transactional-id T
        [--commit-every N] [--abort-every K] [--pause-ms MS]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata


HANG_S = 15   # a copier ended early is harmless: the next one fences it


def say(text: str) -> None:
    print(f"copier: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def watchdog(what: str):
    """End the process if `what` has not returned after HANG_S: kafka-python 3.0.12 can lose a
    transactional request for good (its sender, when connecting to the coordinator raises,
    looks the coordinator up again but neither sends nor re-enqueues the request, leaving
    target_node set; seen with TxnOffsetCommit while the group coordinator's broker was
    down), and the call then waits forever. A new copier fences this one and goes on."""
    def expire():
        say(f"{what} hung for {HANG_S} s; exiting")
        os._exit(3)
    timer = threading.Timer(HANG_S, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class Copier(ConsumerRebalanceListener):
    def __init__(self, args: argparse.Namespace):
        self.args = args
        servers = args.bootstrap.split(",")
        self.consumer = KafkaConsumer(
            bootstrap_servers=servers, group_id=args.group, isolation_level="read_committed",
            enable_auto_commit=False, auto_offset_reset="earliest",
            # A killed broker's group coordinator moves after a ZooKeeper session (6 s) and an
            # election: a longer client session survives it without a rebalance.
            session_timeout_ms=20000, heartbeat_interval_ms=1000, request_timeout_ms=30000)
        self.producer = KafkaProducer(
            bootstrap_servers=servers, transactional_id=args.transactional_id, acks="all",
            transaction_timeout_ms=15000, linger_ms=5, request_timeout_ms=15000, retry_backoff_ms=200)
        self.transactions = 0
        self.pending = 0

    def run(self) -> None:
        # Fences the previous instance and aborts whatever transaction it left open.
        with watchdog("init_transactions"):
            self.producer.init_transactions()
        self.consumer.subscribe([self.args.input], listener=self)
        self.producer.begin_transaction()
        while True:
            batches = self.consumer.poll(timeout_ms=500, max_records=self.args.commit_every - self.pending)
            for tp, records in batches.items():
                for record in records:
                    self._produce(tp.partition, record)
            if self.pending >= self.args.commit_every or (self.pending and not batches):
                self._finish()
                time.sleep(self.args.pause_ms / 1000)

    def _produce(self, partition: int, record) -> None:
        deliberate_abort = (self.transactions + 1) % self.args.abort_every == 0
        prefix = b"aborted:" if deliberate_abort else b"copied:"
        self.producer.send(self.args.output, key=record.key, value=prefix + record.value, partition=partition)
        self.pending += 1

    def _finish(self) -> None:
        self.transactions += 1
        try:
            if self.transactions % self.args.abort_every == 0:
                with watchdog("flush"):
                    self.producer.flush()   # the aborted records reach the log before their marker
                self._abort_and_rewind("on purpose")
            else:
                offsets = {tp: OffsetAndMetadata(self.consumer.position(tp), "", -1)
                           for tp in self.consumer.assignment()}
                with watchdog("send_offsets_to_transaction"):
                    self.producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata())
                with watchdog("commit_transaction"):
                    self.producer.commit_transaction()
        except KafkaError as exc:
            self._abort_and_rewind(repr(exc))
        self.pending = 0
        self.producer.begin_transaction()

    def _abort_and_rewind(self, why: str) -> None:
        """Drop the transaction's output and go back to the offsets that were committed with
        the last committed output, so the dropped records are copied again."""
        if why != "on purpose":
            say(f"aborting after {why}")
        with watchdog("abort_transaction"):
            self.producer.abort_transaction()   # raises if it cannot: the process ends
        for tp in self.consumer.assignment():
            committed = self.consumer.committed(tp)
            if committed is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed)

    def on_partitions_revoked(self, revoked) -> None:
        # The partitions' next owner (maybe this copier again) starts from the committed
        # offsets: what this transaction copied from them must not be committed.
        if self.pending:
            say(f"aborting: partitions revoked {sorted(tp.partition for tp in revoked)}")
            with watchdog("abort_transaction"):
                self.producer.abort_transaction()
            self.pending = 0
            self.producer.begin_transaction()

    def on_partitions_assigned(self, assigned) -> None:
        say(f"assigned {sorted(tp.partition for tp in assigned)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--commit-every", type=int, default=20)
    parser.add_argument("--abort-every", type=int, default=7)
    parser.add_argument("--pause-ms", type=int, default=0, help="sleep after each transaction")
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # the test asks for the stacks of a copier that hangs
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    copier = Copier(parser.parse_args())
    try:
        copier.run()
    except KafkaError as exc:
        say(f"exiting on {exc!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
