"""What every client command shares: argument types, the session that holds a command's
clients and reports their failures as one `ottla: ...` line, and table printing.

Commands reach the broker over the Kafka protocol through confluent-kafka, as any application
would, so they also show whether the broker serves real clients correctly. The admin APIs
librdkafka lacks go through `ottla.admin_client`. confluent_kafka is imported inside the
commands so that `ottla serve` does not pay for it.

Every command returns 0 on success, 1 on an operational failure and 2 on bad usage.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import socket
import sys
from typing import Any, Callable, Iterable

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CLIENT_ID = "ottla-cli"

# librdkafka's logical offsets (rd_kafka_offset_t); the Python binding exports all but TAIL.
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_TAIL_BASE = -2000


# Kafka API keys that consumer-group features need, checked before librdkafka is asked.
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 14, 15, 16, 42
GROUP_MEMBER_APIS = (FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, OFFSET_FETCH, OFFSET_COMMIT)


class CommandFailed(Exception):
    """An operational failure worth one line to the user: exit code 1."""


class UsageError(Exception):
    """Bad arguments that argparse cannot catch on its own: exit code 2, as argparse uses."""


# --- argument parsing --------------------------------------------------------------------

def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _start_offset(text: str) -> int:
    """beginning|end|stored, an absolute offset, or -N for N records before the end."""
    named = {"beginning": OFFSET_BEGINNING, "start": OFFSET_BEGINNING, "earliest": OFFSET_BEGINNING,
             "end": OFFSET_END, "latest": OFFSET_END, "stored": OFFSET_STORED}
    if text in named:
        return named[text]
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected beginning, end, stored, an offset or -N, got {text!r}") from None
    return value if value >= 0 else OFFSET_TAIL_BASE + value


# --- shared plumbing ---------------------------------------------------------------------

def _command(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn expected failures into one `ottla: ...` line and an exit code."""

    @functools.wraps(function)
    def run(args: argparse.Namespace) -> int:
        from confluent_kafka import KafkaException

        from ..admin_client import ProtocolClientError

        try:
            return function(args)
        except UsageError as exc:
            print(f"ottla: error: {exc}", file=sys.stderr)
            return 2
        except (CommandFailed, ProtocolClientError) as exc:
            print(f"ottla: {exc}", file=sys.stderr)
            return 1
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            print(f"ottla: {error.str() if hasattr(error, 'str') else error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, and keep Python from
            # complaining when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return run


def _strip_location(text: str) -> str:
    """librdkafka's "host:port/id: Connect to ... failed: X (after 0ms in state CONNECT)" -> the middle."""
    text = re.sub(r"^\S+/\w+: ", "", text)
    return re.sub(r"\s*\(after \d+ms in state \w+\)$", "", text)


class Session:
    """Settings shared by one command's clients, and how their failures are reported."""

    def __init__(self, args: argparse.Namespace):
        self.bootstrap: str = args.bootstrap_server
        self.timeout: float = args.timeout
        self._errors: list = []  # from librdkafka's error_cb: why a broker could not be reached
        self._clients: list = []
        self._admin = None
        self._probe()

    def _probe(self) -> None:
        """Fail at once when nothing listens; librdkafka would keep retrying until the timeout."""
        from ..admin_client import split_address

        reason = "no address given"
        for address in filter(None, (part.strip() for part in self.bootstrap.split(","))):
            try:
                socket.create_connection(split_address(address), timeout=self.timeout).close()
                return
            except OSError as exc:
                reason = exc.strerror or str(exc)
        raise CommandFailed(f"cannot reach broker at {self.bootstrap} ({reason})")

    def config(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        config = {
            "bootstrap.servers": self.bootstrap,
            "client.id": CLIENT_ID,
            "socket.connection.setup.timeout.ms": int(self.timeout * 1000),
            "allow.auto.create.topics": False,
            # Problems surface as one clear message instead of librdkafka's log lines.
            "log_level": 0,
            "error_cb": self._errors.append,
        }
        config.update(extra or {})
        return config

    def _track(self, client):
        self._clients.append(client)
        return client

    def admin(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = self._track(AdminClient(self.config()))
        return self._admin

    def producer(self, extra: dict[str, Any]):
        from confluent_kafka import Producer

        return self._track(Producer(self.config(extra)))

    def consumer(self, extra: dict[str, Any]):
        from confluent_kafka import Consumer

        return self._track(Consumer(self.config(extra)))

    def unreachable(self) -> CommandFailed:
        from confluent_kafka import KafkaError

        for client in self._clients:
            client.poll(0)  # runs error_cb for the errors librdkafka has queued
        reasons = [_strip_location(error.str()) for error in self._errors
                   if error.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE)]
        suffix = f" ({reasons[0]})" if reasons else ""
        return CommandFailed(f"cannot reach broker at {self.bootstrap}{suffix}")

    def failure(self, exc: Exception, action: str, known: dict[int, str] | None = None) -> CommandFailed:
        """A CommandFailed for a librdkafka error, with the broker-level causes spelled out."""
        from confluent_kafka import KafkaError, KafkaException

        if not isinstance(exc, KafkaException) or not exc.args or not isinstance(exc.args[0], KafkaError):
            return CommandFailed(f"{action}: {exc}")
        error = exc.args[0]
        code = error.code()
        if known and code in known:
            return CommandFailed(known[code])
        if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE):
            return self.unreachable()
        if code == KafkaError._TIMED_OUT:
            return CommandFailed(f"{action}: broker at {self.bootstrap} did not answer within "
                                 f"{self.timeout:g}s")
        if code == KafkaError._UNSUPPORTED_FEATURE:
            return CommandFailed(f"{action}: the broker at {self.bootstrap} does not support this request")
        return CommandFailed(f"{action}: {error.str()}")

    def wait(self, future, action: str, known: dict[int, str] | None = None, absent: int | None = None):
        """The result of an admin future (None on error code `absent`), else a CommandFailed."""
        import concurrent.futures

        from confluent_kafka import KafkaException

        try:
            return future.result(timeout=2 * self.timeout + 1)
        except concurrent.futures.TimeoutError:
            raise CommandFailed(f"{action}: broker at {self.bootstrap} did not answer within "
                                f"{self.timeout:g}s") from None
        except Exception as exc:
            if absent is not None and isinstance(exc, KafkaException) and exc.args[0].code() == absent:
                return None
            raise self.failure(exc, action, known) from None

    def metadata(self, client, topic: str | None = None):
        """Cluster metadata; the first call also proves the broker is reachable."""
        from confluent_kafka import KafkaException

        try:
            return client.list_topics(topic, timeout=self.timeout)
        except KafkaException as exc:
            raise self.failure(exc, "cannot fetch metadata") from None

    def require_topic(self, client, topic: str):
        from confluent_kafka import KafkaError

        metadata = self.metadata(client, topic).topics.get(topic)
        error = metadata.error if metadata is not None else None
        if metadata is None or (error is not None and error.code() in (
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)):
            raise CommandFailed(f"topic {topic!r} does not exist")
        if error is not None:
            raise CommandFailed(f"topic {topic!r}: {error.str()}")
        return metadata

    def offsets(self, partitions: Iterable[tuple[str, int]], spec,
                isolation=None) -> dict[tuple[str, int], int | None]:
        """ListOffsets per partition; None where the partition has gone. A new leader that
        cannot answer yet (KIP-207) is asked again until the command's timeout."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        from ..end_offsets import list_offsets

        wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not wanted:
            return {}
        options = {} if isolation is None else {"isolation_level": isolation}
        try:
            answers = list_offsets(self.admin(), wanted, timeout_s=self.timeout,
                                   absent=frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART}), **options)
        except KafkaException as exc:
            raise self.failure(exc, "cannot list offsets") from None
        return {(tp.topic, tp.partition): None if info is None else info.offset for tp, info in answers.items()}

    def require_apis(self, api_keys: Iterable[int], feature: str) -> None:
        """librdkafka waits until timeout for a coordinator that cannot exist; say so at once."""
        with self.protocol_client() as client:
            missing = client.missing_apis(api_keys)
        if missing:
            raise CommandFailed(f"broker at {self.bootstrap} does not support {feature} "
                                f"(missing {', '.join(missing)})")

    def protocol_client(self):
        from ..admin_client import AdminProtocolClient

        return AdminProtocolClient(self.bootstrap, timeout=self.timeout, client_id=CLIENT_ID)


def _print_table(headers: list[str], rows: Iterable[Iterable[Any]]) -> None:
    cells = [headers] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _print_fields(pairs: list[tuple[str, Any]]) -> None:
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        print(f"{name.ljust(width)}  {'-' if value is None else value}")
