"""A rolling restart with controlled shutdown, on a real ZooKeeper and three real `ottla serve`
processes, while an idempotent acks=all producer and a consumer group member run throughout.

Each broker in turn gets SIGTERM (ControlledShutdown: the controller moves its leadership
away first), comes back, and rejoins every ISR before the next one goes; the controller is
rolled like the others. The clients must see only retriable errors, and every acknowledged
record is consumed exactly once, in order.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.testing import cluster
from tests.cluster_checks import partition_info
from tests.waiting import wait_for

TOPIC = "rolling"
PARTITIONS = 3
INTERNAL = 3
CONFIG = {"min.insync.replicas": 2, "group.initial.rebalance.delay.ms": 0,
          "offsets.topic.num.partitions": INTERNAL, "transaction.state.log.num.partitions": INTERNAL}
LIMIT_S = 180  # guards against hangs only
# librdkafka's own transport events: a broker's connection closed as it stopped, and an
# auto-commit that found no coordinator while the group's coordinator moved (its request went
# down with the old coordinator's connection). They are informational (not `retriable()`, not
# fatal): the client reconnects or uses another broker, and the next auto-commit carries the
# same offsets (Kafka's Java client calls the latter a RetriableCommitFailedException).
TRANSPORT = {KafkaError._TRANSPORT, KafkaError._WAIT_COORD}


def acceptable(error: KafkaError) -> bool:
    return not error.fatal() and (error.retriable() or error.code() in TRANSPORT)


class Collected(logging.Handler):
    """librdkafka's log lines (it logs the broker errors it retries by itself)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []
        self.group_lines: list[tuple[float, str]] = []  # the consumer's group protocol (debug "cgrp")

    def emit(self, record):
        if record.levelno >= logging.INFO:
            self.lines.append((record.levelno, record.getMessage()))
        elif record.name.endswith(".consumer"):
            self.group_lines.append((record.created, record.getMessage()))

    def group_story(self, around: float) -> str:
        """The consumer's group protocol from 15 s before `around` to 2 s after: what a
        failure's message shows, so a CI run that fails says why."""
        return "\n".join(line for at, line in self.group_lines if around - 15 <= at <= around + 2)[-12000:]


def client_logger(name: str, handler: Collected) -> logging.Logger:
    logger = logging.getLogger(f"tests.rolling.{name}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


class Clients:
    """An idempotent acks=all producer sending 0, 1, 2, ... round-robin over the partitions,
    and a consumer in a group reading them, each on its own thread, every error kept."""

    def __init__(self, bootstrap: str):
        self.errors: list[tuple[str, KafkaError]] = []
        self.error_times: list[float] = []  # when each error came, for a failure's message
        self.acked: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.consumed: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.next_offset: dict[int, int] = {}
        self.logs = Collected()
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 300000,
                                  "error_cb": lambda e: self._error("producer", e),
                                  "logger": client_logger("producer", self.logs)})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rolling", "auto.offset.reset": "earliest",
                                  "auto.commit.interval.ms": 500, "session.timeout.ms": 10000, "debug": "cgrp",
                                  "error_cb": lambda e: self._error("consumer", e),
                                  "on_commit": self._committed, "logger": client_logger("consumer", self.logs)})
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def _error(self, who: str, error: KafkaError) -> None:
        self.errors.append((who, error))
        self.error_times.append(time.time())

    def _committed(self, error, partitions):
        if error is not None:
            self._error("commit", error)
        for tp in partitions:
            if tp.error is not None:
                self._error("commit", tp.error)

    def _delivered(self, error, message):
        if error is None:
            self.acked[message.partition()].append(int(message.value()))
        else:
            self._error("delivery", error)

    def _produce(self):
        n = 0
        while not self._stop_producing.is_set():
            if n - self.acked_count() < 100:  # a steady rate: at most 100 in flight
                self.producer.produce(TOPIC, str(n).encode(), partition=n % PARTITIONS, on_delivery=self._delivered)
                n += 1
            self.producer.poll(0.002)
        self.unflushed = self.producer.flush(LIMIT_S)

    def _assigned(self, consumer, partitions):
        """Resume where this consumer got to, not at the last commit: a rebalance must not
        make it read twice what it already read (the offsets are kept outside Kafka)."""
        for tp in partitions:
            tp.offset = self.next_offset.get(tp.partition, tp.offset)
        consumer.assign(partitions)

    def _consume(self):
        self.consumer.subscribe([TOPIC], on_assign=self._assigned)
        while not self._stop_consuming.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                self._error("message", message.error())
                continue
            self.consumed[message.partition()].append(int(message.value()))
            self.next_offset[message.partition()] = message.offset() + 1

    def acked_count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def consumed_count(self) -> int:
        return sum(len(v) for v in self.consumed.values())

    def start(self):
        for thread in self._threads:
            thread.start()

    def stop_producing(self):
        self._stop_producing.set()
        self._threads[0].join()

    def stop(self):
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            thread.join()
        self.consumer.close()


def in_sync(bootstrap: str, topic: str, count: int) -> bool:
    """Every partition led, with all three replicas in its ISR."""
    for p in range(count):
        info = partition_info(bootstrap, topic, p)
        if info is None or info[0] < 0 or len(info[2]) != 3:
            return False
    return True


def controller_id(admin: AdminClient) -> int:
    return admin.describe_cluster(request_timeout=10).result(60).controller.id


def test_rolling_restart_with_controlled_shutdown_shows_clients_only_retriable_errors(tmp_path):
    with cluster(brokers=3, config=CONFIG, root=tmp_path / "cluster") as three:
        admin = AdminClient({"bootstrap.servers": three.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], request_timeout=60)[TOPIC].result(60)
        wait_for(lambda: in_sync(three.bootstrap, TOPIC, PARTITIONS), timeout=LIMIT_S, what="the topic in sync")
        clients = Clients(three.bootstrap)
        clients.start()
        try:
            wait_for(lambda: in_sync(three.bootstrap, "__consumer_offsets", INTERNAL), timeout=LIMIT_S,
                     what="__consumer_offsets in sync")
            wait_for(lambda: clients.consumed_count() >= 300, timeout=LIMIT_S, what="records consumed")
            first_controller = controller_id(admin)
            rolled = []
            for broker_id in sorted(three.brokers):
                handle = three.brokers[broker_id]
                assert handle.stop() == 0  # SIGTERM: controlled shutdown, then a clean stop
                assert f"controlled shutdown of broker {broker_id} succeeded" in handle.read_stderr()
                rolled.append(broker_id)
                before = clients.acked_count(), clients.consumed_count()
                wait_for(lambda: clients.acked_count() >= before[0] + 200 and clients.consumed_count() >= before[1] + 200,
                         timeout=LIMIT_S, what=f"progress while broker {broker_id} is down")
                handle.start()
                for topic, count in ((TOPIC, PARTITIONS), ("__consumer_offsets", INTERNAL)):
                    wait_for(lambda: in_sync(three.bootstrap, topic, count), timeout=LIMIT_S,
                             what=f"{topic} in sync after broker {broker_id} is back")
            assert first_controller in rolled
            clients.stop_producing()
            assert clients.unflushed == 0
            wait_for(lambda: clients.consumed_count() >= clients.acked_count(), timeout=LIMIT_S,
                     what="every acknowledged record consumed")
        finally:
            clients.stop()
    unacceptable = [(who, error, at) for (who, error), at in zip(clients.errors, clients.error_times)
                    if not acceptable(error)]
    assert [(who, error.name()) for who, error, _ in unacceptable] == [], clients.logs.group_story(unacceptable[0][2])
    # What librdkafka logged at warning or worse: only its connections to a stopped broker.
    assert [line for level, line in clients.logs.lines if level >= logging.WARNING and not line.startswith("FAIL ")] == []
    for p in range(PARTITIONS):
        assert clients.acked[p] == sorted(clients.acked[p])
        assert clients.consumed[p] == clients.acked[p], f"partition {p}: consumed differs from acknowledged"
