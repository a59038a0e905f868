"""Exactly-once copier: consume-transform-produce with confluent-kafka, run as its own process.

test_transactions_e2e.py kills it with SIGKILL at random points and restarts it; whatever it
did not commit must be redone exactly once. Each output record is `copied:<input value>` on
the input record's partition index, and the consumer's offsets go into the same transaction.
Errors are handled as librdkafka documents for transactional producers: retriable errors
are retried, abortable ones abort the transaction and rewind the consumer to its committed
offsets, fatal ones end the process with a non-zero status (the test starts a new one, which
fences this instance).

    python copier.py BOOTSTRAP INPUT OUTPUT --group G --transactional-id T --commit-every N [--session-timeout-ms MS]
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

_TIMEOUT_S = 60


def _retrying(operation, *args):
    """Repeat `operation` while it fails with a retriable error (e.g. a timeout while the
    broker restarts); abortable and fatal errors go to the caller."""
    while True:
        try:
            return operation(*args)
        except KafkaException as exc:
            if not exc.args[0].retriable() or exc.args[0].fatal() or exc.args[0].txn_requires_abort():
                raise
            print(f"copier: retrying {operation.__name__} after {exc.args[0]}", file=sys.stderr, flush=True)


class Copier:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.consumer = Consumer({
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
        self.producer = Producer({
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
        self.pending = 0

    def run(self) -> None:
        # Fences the previous instance and aborts whatever transaction it left open.
        _retrying(self.producer.init_transactions, _TIMEOUT_S)
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

    def _produce(self, message) -> None:
        while True:
            try:
                self.producer.produce(self.args.output, key=message.key(), value=b"copied:" + message.value(),
                                      partition=message.partition())
                break
            except BufferError:
                self.producer.poll(0.1)
        self.pending += 1

    def _commit(self) -> None:
        try:
            positions = self.consumer.position(self.consumer.assignment())
            _retrying(self.producer.send_offsets_to_transaction, positions,
                      self.consumer.consumer_group_metadata(), _TIMEOUT_S)
            _retrying(self.producer.commit_transaction, _TIMEOUT_S)
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
        _retrying(self.producer.abort_transaction, _TIMEOUT_S)
        assignment = self.consumer.assignment()
        for committed in _retrying(self.consumer.committed, assignment, _TIMEOUT_S):
            offset = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(committed.topic, committed.partition, offset))

    def _on_revoke(self, consumer, partitions) -> None:
        # The partitions' next owner starts from the committed offsets: what this transaction
        # copied from them must not be committed.
        if self.pending:
            _retrying(self.producer.abort_transaction, _TIMEOUT_S)
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
    copier = Copier(parser.parse_args())
    try:
        copier.run()
    except KafkaException as exc:
        print(f"copier: exiting on {exc.args[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
