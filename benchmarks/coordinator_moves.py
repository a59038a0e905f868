"""How long clients see NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS when the broker hosting a
group's and a transactional id's coordinators is stopped with SIGTERM (controlled shutdown), on
three brokers (`ottla.testing.cluster`, a real ZooKeeper).

Each round picks the broker that hosts the transactional id's coordinator (and a group placed on
the same broker), keeps a consumer in that group and a transactional producer committing, and
probes every broker every 10 ms over its own socket: FindCoordinator for both keys (whom this
broker names), then DescribeGroups and DescribeTransactions to the broker named (what the client
sent there gets). After SIGTERM the table gives, per probe, the first and last moment (ms after
the signal) of each answer, and for the real clients the first successful commit after it.
The round where the stopped broker is the controller is the slow one: the new controller is
elected only once the old one's session ends.

    PYTHONPATH=src python benchmarks/coordinator_moves.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import re
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from ottla.admin_client import AdminProtocolClient, BrokerConnection, ProtocolClientError
from ottla.errors import ErrorCode
from ottla.testing import cluster

FIND_COORDINATOR = 10
GROUP, TRANSACTION = 0, 1
PROBE_S = 0.01
SHOW_LINES = False  # --show-client-lines


def name(code: int) -> str:
    return "OK" if code == 0 else ErrorCode(code).name.upper()


class Probe(threading.Thread):
    """Asks one broker, every 10 ms, whom it names for both keys, and asks the named brokers."""

    def __init__(self, c, broker_id: int, group: str, txn: str, t0: list[float]):
        super().__init__(daemon=True)
        self.c, self.broker_id, self.group, self.txn, self.t0 = c, broker_id, group, txn, t0
        self.samples: list[tuple[float, str, str]] = []  # (seconds since SIGTERM, what, answer)
        self.done = threading.Event()
        self.connections: dict[int, BrokerConnection] = {}

    def connection(self, broker_id: int) -> BrokerConnection:
        if broker_id not in self.connections:
            host, port = self.c.brokers[broker_id].bootstrap.rsplit(":", 1)
            self.connections[broker_id] = BrokerConnection(host, int(port), timeout=2, client_id="probe")
        return self.connections[broker_id]

    def ask(self, broker_id: int, request):
        try:
            return self.connection(broker_id).send(request.__api_key__, request.__version__, request)
        except (ProtocolClientError, OSError):
            self.connections.pop(broker_id, None)
            return None

    def record(self, what: str, answer: str) -> None:
        self.samples.append((time.monotonic() - self.t0[0], what, answer))

    def run(self) -> None:
        while not self.done.is_set():
            for key_type, key in ((GROUP, self.group), (TRANSACTION, self.txn)):
                label = "group" if key_type == GROUP else "txn"
                found = self.ask(self.broker_id, FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,)))
                if found is None:
                    self.record(f"find {label}", "down")
                    continue
                answer = found.coordinators[0]
                self.record(f"find {label}", f"{answer.node_id}" if answer.error_code == 0 else name(answer.error_code))
                if answer.error_code != 0:
                    continue
                if key_type == GROUP:
                    response = self.ask(answer.node_id, DescribeGroupsRequest(groups=(key,),
                                                                              include_authorized_operations=False))
                    code = None if response is None else response.groups[0].error_code
                else:
                    response = self.ask(answer.node_id, DescribeTransactionsRequest(transactional_ids=(key,)))
                    code = None if response is None else response.transaction_states[0].error_code
                self.record(f"{label} at {answer.node_id}", "down" if code is None else name(code))
            time.sleep(PROBE_S)


# librdkafka logs an error by name (NOT_COORDINATOR) or by text (Broker: Not coordinator).
COORDINATOR_ERRORS = re.compile(r"NOT_COORDINATOR|COORDINATOR_LOAD_IN_PROGRESS|COORDINATOR_NOT_AVAILABLE"
                                r"|Not coordinator|Coordinator load in progress|Coordinator not available")


class ErrorLog(logging.Handler):
    """librdkafka's debug lines (cgrp, eos) that name a coordinator error, as samples."""

    def __init__(self, outcomes: list, t0: list[float], what: str):
        super().__init__()
        self.outcomes, self.t0, self.what = outcomes, t0, what

    def emit(self, record: logging.LogRecord) -> None:
        found = COORDINATOR_ERRORS.search(record.getMessage())
        if found:
            self.outcomes.append((time.monotonic() - self.t0[0], self.what, found.group(0)))
            if SHOW_LINES:
                print(f"  {(time.monotonic() - self.t0[0]) * 1000:.0f} ms {self.what}: {record.getMessage()}")


def client_logger(outcomes: list, t0: list[float], what: str) -> logging.Logger:
    logger = logging.getLogger(f"coordinator-moves.{what}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.handlers = [ErrorLog(outcomes, t0, what)]
    return logger


class Clients(threading.Thread):
    """A group consumer committing after each poll and a transactional producer committing one
    record at a time; records each commit's outcome, and each coordinator error librdkafka
    logs (it retries them without telling the application)."""

    def __init__(self, c, group: str, txn: str, t0: list[float]):
        super().__init__(daemon=True)
        self.c, self.group, self.txn, self.t0 = c, group, txn, t0
        self.done = threading.Event()
        self.outcomes: list[tuple[float, str, str]] = []

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.c.bootstrap, "group.id": self.group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False, "debug": "cgrp"},
                            logger=client_logger(self.outcomes, self.t0, "consumer log"))
        consumer.subscribe(["moves"])
        producer = Producer({"bootstrap.servers": self.c.bootstrap, "transactional.id": self.txn,
                             "transaction.timeout.ms": 60000, "debug": "eos"},
                            logger=client_logger(self.outcomes, self.t0, "producer log"))
        producer.init_transactions(60)
        while not self.done.is_set():
            try:
                producer.begin_transaction()
                producer.produce("moves", b"x")
                producer.commit_transaction(30)
                self.outcomes.append((time.monotonic() - self.t0[0], "txn commit", "OK"))
            except KafkaException as exc:
                self.outcomes.append((time.monotonic() - self.t0[0], "txn commit", exc.args[0].name()))
                if exc.args[0].txn_requires_abort():
                    producer.abort_transaction(30)
            producer.poll(0)  # hands over librdkafka's log lines
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                try:
                    consumer.commit(message, asynchronous=False)
                    self.outcomes.append((time.monotonic() - self.t0[0], "group commit", "OK"))
                except KafkaException as exc:
                    self.outcomes.append((time.monotonic() - self.t0[0], "group commit", exc.args[0].name()))
        consumer.close()


def coordinator(c, key_type: int, key: str) -> int:
    host, port = next(b for b in c.brokers.values() if b.running()).bootstrap.rsplit(":", 1)
    connection = BrokerConnection(host, int(port), timeout=10, client_id="probe")
    try:
        while True:
            request = FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,))
            answer = connection.send(FIND_COORDINATOR, 4, request).coordinators[0]
            if answer.error_code == 0:
                return answer.node_id
            time.sleep(0.1)  # the internal topic is being created
    finally:
        connection.close()


def controller_id(c) -> int:
    with AdminProtocolClient(c.bootstrap, timeout=10) as client:
        return client.metadata_response([]).controller_id


def summarize(samples: list[tuple[float, str, str]]) -> list[tuple[str, str, float, float, int, float]]:
    """(what, answer, first, last, count, longest gap between two) of the samples after the
    signal, in order of first sight."""
    rows: dict[tuple[str, str], list[float]] = {}
    for t, what, answer in samples:
        if t >= 0:
            rows.setdefault((what, answer), []).append(t)
    return [(what, answer, ts[0], ts[-1], len(ts), max((b - a for a, b in zip(ts, ts[1:])), default=0.0))
            for (what, answer), ts in rows.items()]


def one_round(c, round_no: int, want_controller: bool) -> None:
    txn = next(f"txn-{round_no}-{i}" for i in itertools.count()
               if (coordinator(c, TRANSACTION, f"txn-{round_no}-{i}") == controller_id(c)) == want_controller)
    victim = coordinator(c, TRANSACTION, txn)
    group = next(g for g in (f"group-{round_no}-{i}" for i in itertools.count())
                 if coordinator(c, GROUP, g) == victim)
    t0 = [time.monotonic() + 3600]
    clients = Clients(c, group, txn, t0)
    clients.start()
    while not any(o[2] == "OK" for o in clients.outcomes if o[1] == "group commit"):
        time.sleep(0.1)
    probes = [Probe(c, b, group, txn, t0) for b in sorted(c.brokers)]
    for probe in probes:
        probe.start()
    time.sleep(1.0)
    print(f"\nround {round_no}: SIGTERM of broker {victim} (coordinator of {txn} and {group};"
          f" {'the' if want_controller else 'not the'} controller)", flush=True)
    t0[0] = time.monotonic()
    c.brokers[victim].stop()
    stopped = time.monotonic() - t0[0]
    time.sleep(8.0)
    for probe in probes:
        probe.done.set()
    clients.done.set()
    for thread in (*probes, clients):
        thread.join(60)
    print(f"broker {victim} exited {stopped * 1000:.0f} ms after SIGTERM")
    print("| probe via | asked | answer | first (ms) | last (ms) | samples | longest gap (ms) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    rows = [(probe.broker_id, row) for probe in probes for row in summarize(probe.samples)]
    rows += [("client", row) for row in summarize(clients.outcomes)]
    for via, (what, answer, first, last, count, gap) in rows:
        print(f"| {via} | {what} | {answer} | {first * 1000:.0f} | {last * 1000:.0f} | {count} | {gap * 1000:.0f} |")
    c.brokers[victim].start()
    c.restore()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds alternate: not the controller, the controller")
    parser.add_argument("--show-client-lines", action="store_true", help="print librdkafka's coordinator-error lines")
    args = parser.parse_args()
    global SHOW_LINES
    SHOW_LINES = args.show_client_lines
    with cluster(brokers=3) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("moves", 3, 3)])["moves"].result(60)
        c.restore()
        for round_no in range(args.rounds):
            one_round(c, round_no, want_controller=round_no % 2 == 1)


if __name__ == "__main__":
    main()
