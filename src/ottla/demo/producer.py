"""The demo's input: payments written in transactions by one transactional producer, some aborted on purpose.

Every payment gets a fresh id and is never sent twice: a transaction that fails is given up, not
retried with the same payments. So the committed input is exactly the payments of the committed
transactions, which is what the verifier reads back; the producer's own bookkeeping is only a
cross-check (a commit can fail ambiguously when the broker dies under it).
"""

from __future__ import annotations

import json
import random
import threading
import time

from confluent_kafka import KafkaException, Producer

ABORT_EVERY = 7
"""Every 7th transaction is aborted on purpose, after its records reached the log."""
TIMEOUT_S = 30.0


def payment(number: int, rng: random.Random) -> dict:
    """Mostly small and medium amounts, a few large ones; 40 accounts."""
    cents = rng.choice((rng.randint(100, 999), rng.randint(1_000, 99_999), rng.randint(1_000, 99_999),
                        rng.randint(100_000, 2_500_000)))
    return {"id": f"pay-{number:07d}", "account": f"acct-{rng.randrange(40):03d}", "amount_cents": cents,
            "currency": rng.choice(("EUR", "EUR", "USD", "GBP"))}


class PaymentProducer(threading.Thread):
    """Writes `events` payments in transactions of `per_txn`, at most `rate` payments/s and never past
    `allowed` (which the demo keeps a little ahead of the pipeline's output, so that the input is still
    flowing when the demo crashes things, however fast or slow the machine).

    Counters are read by the demo's progress lines while the thread runs."""

    def __init__(self, bootstrap: str, topic: str, events: int, *, per_txn: int = 100, rate: float = 500.0,
                 seed: int = 6):
        super().__init__(name="payments-producer", daemon=True)
        self.bootstrap, self.topic, self.events, self.per_txn, self.rate = bootstrap, topic, events, per_txn, rate
        self.rng = random.Random(seed)
        self.produced = self.committed = self.aborted = self.failed = self.in_doubt = 0
        self.transactions = self.producer_restarts = 0
        self.aborted_ids: set[str] = set()
        self.committed_ids: set[str] = set()
        self.error: BaseException | None = None
        self.allowed = events

    def _new_producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "demo-payments",
                             "linger.ms": 5, "log_level": 0})
        producer.init_transactions(TIMEOUT_S)
        return producer

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the demo, which fails
            self.error = error

    def _run(self) -> None:
        producer = self._new_producer()
        started = time.monotonic()
        number = 0
        while number < self.events:
            while number >= self.allowed:
                time.sleep(0.05)
            ids = []
            producer.begin_transaction()
            for _ in range(min(self.per_txn, self.events - number)):
                event = payment(number, self.rng)
                _produce(producer, self.topic, event)
                ids.append(event["id"])
                number += 1
            self.produced = number
            self.transactions += 1
            outcome = self._finish(producer, ids, on_purpose=self.transactions % ABORT_EVERY == 0)
            if outcome == "fatal":
                self.producer_restarts += 1
                producer = self._new_producer()  # fences the old instance; the coordinator ends its transaction
            ahead = number / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)

    def _finish(self, producer: Producer, ids: list[str], *, on_purpose: bool) -> str:
        """Commit or abort; returns committed, aborted or fatal (the outcome is then up to the coordinator)."""
        try:
            if on_purpose:
                producer.flush(TIMEOUT_S)  # so the aborted records are really in the log
                _retrying(producer.abort_transaction)
                self.aborted += len(ids)
                self.aborted_ids.update(ids)
                return "aborted"
            _retrying(producer.commit_transaction)
            self.committed += len(ids)
            self.committed_ids.update(ids)
            return "committed"
        except KafkaException as error:
            if error.args[0].txn_requires_abort():
                _retrying(producer.abort_transaction)
                self.failed += len(ids)
                self.aborted_ids.update(ids)
                return "aborted"
            if error.args[0].fatal():
                self.in_doubt += len(ids)
                return "fatal"
            raise


def _retrying(call) -> None:
    """librdkafka's rule for commit and abort: a retriable error means call again (e.g. the broker is
    restarting); anything else is for the caller."""
    while True:
        try:
            return call(TIMEOUT_S)
        except KafkaException as error:
            if not error.args[0].retriable():
                raise


def _produce(producer: Producer, topic: str, event: dict) -> None:
    while True:
        try:
            producer.produce(topic, json.dumps(event).encode(), event["account"].encode())
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.1)
