"""Exactly-once copier: consume-transform-produce with confluent-kafka, run as its own process.

test_transactions_e2e.py kills it with SIGKILL at random points and restarts it, and
test_copier_cluster.py bounces the brokers under it; whatever it did not commit must be
redone exactly once. Each output record is `copied:<input value>` on the input record's
partition index, and the consumer's offsets go into the same transaction. With
`--abort-every K` every K-th transaction writes `aborted:<input value>` records and is
aborted on purpose, so a read_committed reader has aborted records to not see.
Errors are handled as librdkafka documents for transactional producers: retriable errors
are retried, abortable ones abort the transaction and rewind the consumer to its committed
offsets, fatal ones end the process with a non-zero status (the test starts a new one, which
fences this instance).

    python copier.py BOOTSTRAP INPUT OUTPUT --group G --transactional-id T --commit-every N
        [--session-timeout-ms MS] [--abort-every K] [--pause-ms MS] [--timeout-s S] [--debug CONTEXTS]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

# librdkafka (2.16) can block in send_offsets_to_transaction() past its timeout, for good:
# it drops a broker that a Metadata answer leaves out (a broker killed with kill -9, once
# its ZooKeeper session has expired, exactly as Kafka leaves it out), yet keeps it cached
# as the group coordinator and waits for that dropped broker to come up (librdkafka #5511;
# the request's own timeout is never checked, #5456). Seen on three brokers after the group
# coordinator's kill -9: "Handle is terminating in state TRY_CONNECT" repeated for the
# dropped broker for minutes, the restarted broker back in Metadata answers all along. A
# call still blocked this long after its timeout ends the process; the next copier fences it.
_GRACE_S = 10
# A group coordinator that moved, or is still loading the group: librdkafka (2.16) hands these
# to the caller of committed() without the retriable flag, having only started to look the
# coordinator up again ("OffsetFetchRequest failed: Broker: Not coordinator: actions Refresh");
# Kafka's Java consumer retries them. Met on a cluster: a broker restarted right after kill -9
# answers NOT_COORDINATOR until the controller hands its partitions back, while the other
# brokers' metadata still name it the coordinator.
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS}


@contextlib.contextmanager
def _watchdog(what: str, seconds: float):
    def expire():
        print(f"copier: {what} still blocked {seconds} s on; exiting", file=sys.stderr, flush=True)
        os._exit(3)
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _retrying(operation, *args, timeout_s: float, also: frozenset | set = frozenset()):
    """Call `operation(*args, timeout_s)` again while it fails with a retriable error (e.g. a
    timeout while the broker restarts) or one of `also`; abortable and fatal errors go to
    the caller."""
    while True:
        try:
            with _watchdog(operation.__name__, timeout_s + _GRACE_S):
                return operation(*args, timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() not in also and (not error.retriable() or error.fatal() or error.txn_requires_abort()):
                raise
            print(f"copier: retrying {operation.__name__} after {error}", file=sys.stderr, flush=True)
            if error.code() in also:
                time.sleep(0.2)   # for the coordinator lookup librdkafka started


class Copier:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        debug = {"debug": args.debug} if args.debug else {}   # librdkafka's own log, to stderr
        self.consumer = Consumer({**debug,
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            # Static membership: a restarted copier takes over the dead one's assignment at once
            # instead of waiting for its session to expire.
            "group.instance.id": f"{args.group}-copier",
            "session.timeout.ms": args.session_timeout_ms,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        })
        self.producer = Producer({**debug,
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": 30000,
            "linger.ms": 5,
            # When its only broker goes down, librdkafka (2.16) re-bootstraps and decommissions
            # the broker it knew; send_offsets_to_transaction() can then wait for that broker's
            # group coordinator forever, past its timeout (librdkafka issues #5456, #5511). The
            # broker comes back at the same address, so keep it instead.
            "metadata.recovery.strategy": "none",
        })
        self.timeout_s = args.timeout_s
        self.pending = 0
        self.transactions = 0

    def run(self) -> None:
        # Fences the previous instance and aborts whatever transaction it left open.
        _retrying(self.producer.init_transactions, timeout_s=self.timeout_s)
        self.consumer.subscribe([self.args.input], on_revoke=self._on_revoke)
        self.producer.begin_transaction()
        while True:
            messages = self.consumer.consume(self.args.commit_every - self.pending, 0.5)
            for message in messages:
                error = message.error()
                if error is None:
                    self._produce(message)
                elif error.fatal() or error.code() == KafkaError._FATAL:  # e.g. a fenced static member
                    raise KafkaException(error)
                else:   # e.g. the broker is down for a moment; librdkafka reconnects by itself
                    print(f"copier: consumer reports {error}", file=sys.stderr, flush=True)
            if self.pending >= self.args.commit_every or (self.pending and not messages):
                self._commit()
                time.sleep(self.args.pause_ms / 1000)

    def _produce(self, message) -> None:
        prefix = b"aborted:" if self._deliberate_abort() else b"copied:"
        while True:
            try:
                self.producer.produce(self.args.output, key=message.key(), value=prefix + message.value(),
                                      partition=message.partition())
                break
            except BufferError:
                self.producer.poll(0.1)
        self.pending += 1

    def _deliberate_abort(self) -> bool:
        return bool(self.args.abort_every) and (self.transactions + 1) % self.args.abort_every == 0

    def _commit(self) -> None:
        deliberate_abort = self._deliberate_abort()
        self.transactions += 1
        try:
            if deliberate_abort:
                self.producer.flush(self.timeout_s)   # the aborted records reach the log before their marker
                self._abort_and_rewind()
            else:
                positions = self.consumer.position(self.consumer.assignment())
                _retrying(self.producer.send_offsets_to_transaction, positions,
                          self.consumer.consumer_group_metadata(), timeout_s=self.timeout_s)
                _retrying(self.producer.commit_transaction, timeout_s=self.timeout_s)
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            print(f"copier: aborting after {exc.args[0]}", file=sys.stderr, flush=True)
            self._abort_and_rewind()
        self.pending = 0
        self.producer.begin_transaction()

    def _abort_and_rewind(self) -> None:
        """Drop the transaction's output and go back to the offsets that were committed with
        the last committed output, so the dropped records are copied again."""
        _retrying(self.producer.abort_transaction, timeout_s=self.timeout_s)
        assignment = self.consumer.assignment()
        committed_offsets = _retrying(self.consumer.committed, assignment, timeout_s=self.timeout_s,
                                      also=_COORDINATOR_MOVING)
        for committed in committed_offsets:
            offset = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(committed.topic, committed.partition, offset))

    def _on_revoke(self, consumer, partitions) -> None:
        # The partitions' next owner starts from the committed offsets: what this transaction
        # copied from them must not be committed.
        if self.pending:
            _retrying(self.producer.abort_transaction, timeout_s=self.timeout_s)
            self.pending = 0
            self.producer.begin_transaction()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--commit-every", type=int, default=1000)
    # On a cluster, kill -9 of the group coordinator's broker leaves the group without a
    # coordinator for a ZooKeeper session timeout and an election; a client session shorter
    # than that times out, and librdkafka (2.16) then heartbeats with an empty member id and
    # is fenced for good (FENCED_INSTANCE_ID, librdkafka issue #3437). Kafka's default is 45 s.
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--abort-every", type=int, default=0, help="abort every K-th transaction on purpose")
    parser.add_argument("--pause-ms", type=int, default=0, help="sleep after each transaction")
    parser.add_argument("--timeout-s", type=float, default=60, help="of each transactional call")
    parser.add_argument("--debug", default="", help="librdkafka debug contexts, e.g. eos,cgrp,broker")
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # the test asks for the stacks of a copier that hangs
    copier = Copier(parser.parse_args())
    try:
        copier.run()
    except KafkaException as exc:
        print(f"copier: exiting on {exc.args[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
