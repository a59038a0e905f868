"""Client commands: `topics`, `produce`, `consume`, `groups`, `transactions`, `producers`.

They reach the broker over the Kafka protocol through confluent-kafka, as any application
would, so they also show whether the broker serves real clients correctly. The admin APIs
librdkafka lacks (transactions, producer state) go through `ottla.admin_client`.
confluent_kafka is imported inside the commands so that `ottla serve` does not pay for it.

Every command returns 0 on success, 1 on an operational failure and 2 on bad usage, and
reports failures as one `ottla: ...` line on stderr rather than a traceback.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import socket
import sys
from datetime import datetime, timezone
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


def add_commands(commands):
    """Register the client commands; returns the `topics` subcommands and the factory that
    adds one, for commands kept in other modules (client_records)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-b", "--bootstrap-server", metavar="HOST:PORT",
                        default=os.environ.get("OTTLA_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
                        help="broker to contact (default $OTTLA_BOOTSTRAP or 127.0.0.1:9092)")
    common.add_argument("--timeout", type=_positive_float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the broker (default 5)")

    def command(parent, name: str, function: str, help: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(run=f"ottla.client_cli:{function}")
        return parser

    topics = commands.add_parser("topics", help="create, list, describe, reconfigure and delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = command(topic_commands, "create", "topics_create", "create a topic")
    create.add_argument("name")
    create.add_argument("-p", "--partitions", type=_positive_int, default=-1,
                        help="number of partitions (default: the broker's num.partitions)")
    create.add_argument("-r", "--replication-factor", type=_positive_int, default=-1,
                        help="replicas per partition (default: the broker's default)")
    create.add_argument("-c", "--config", type=_key_value, action="append", default=[],
                        metavar="KEY=VALUE", help="a topic config, e.g. cleanup.policy=compact (repeatable)")
    command(topic_commands, "list", "topics_list", "list topics")
    describe = command(topic_commands, "describe", "topics_describe",
                       "show a topic's partitions, offsets and configs")
    describe.add_argument("name")
    alter = command(topic_commands, "alter-config", "topics_alter_config",
                    "set or delete topic configs (IncrementalAlterConfigs)")
    alter.add_argument("name")
    alter.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="set a config (repeatable)")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       help="revert a config to its default (repeatable)")
    delete = command(topic_commands, "delete", "topics_delete", "delete topics")
    delete.add_argument("names", nargs="+", metavar="NAME")

    produce = command(commands, "produce", "produce", "produce stdin lines as records, one per line")
    produce.add_argument("topic")
    produce.add_argument("-k", "--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value "
                              "(lines without SEP get no key)")
    produce.add_argument("-p", "--partition", type=_non_negative_int,
                         help="partition to write to (default: the partitioner picks)")
    produce.add_argument("--acks", choices=["all", "-1", "0", "1"], default="all")
    produce.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none")
    produce.add_argument("-H", "--header", type=_key_value, action="append", default=[],
                         metavar="KEY=VALUE", help="a header for every record (repeatable)")
    produce.add_argument("--delivery-timeout", type=_positive_float, default=30.0, metavar="SECONDS",
                         help="give up on a record after this long (default 30)")

    consume = command(commands, "consume", "consume", "print records to stdout, one per line")
    consume.add_argument("topic")
    consume.add_argument("-p", "--partition", type=_non_negative_int, action="append",
                         help="partition to read (repeatable; default all)")
    consume.add_argument("-o", "--offset", type=_start_offset, metavar="OFFSET",
                         help="where to start: beginning, end, stored, an offset, or -N for the last N "
                              "records of each partition (default beginning; with --group, the "
                              "committed offset)")
    consume.add_argument("-n", "--count", type=_positive_int, help="exit after this many records")
    consume.add_argument("-e", "--exit-at-end", action="store_true",
                         help="exit once every partition has been read to its end")
    consume.add_argument("-f", "--format",
                         help="kcat-style format: %%t topic, %%p partition, %%o offset, %%k key, "
                              "%%v value, %%T timestamp (ms), %%h headers, %%K key length, "
                              "%%S value length, %%%% a percent sign, \\t and \\n (default %%v)")
    consume.add_argument("--print-keys", action="store_true", help="print KEY<tab> before each value")
    consume.add_argument("--print-offsets", action="store_true",
                         help="print PARTITION:OFFSET<tab> before each record")
    consume.add_argument("--isolation", choices=["read_uncommitted", "read_committed"],
                         default="read_uncommitted")
    consume.add_argument("-g", "--group", help="consume as this group, committing offsets")

    groups = commands.add_parser("groups", help="list, describe and delete consumer groups")
    group_commands = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND")
    command(group_commands, "list", "groups_list", "list consumer groups")
    describe = command(group_commands, "describe", "groups_describe",
                       "show a group's members, committed offsets and lag")
    describe.add_argument("groups", nargs="+", metavar="GROUP")
    delete = command(group_commands, "delete", "groups_delete", "delete empty consumer groups")
    delete.add_argument("groups", nargs="+", metavar="GROUP")

    transactions = commands.add_parser("transactions", help="inspect transactions and abort hanging ones")
    transaction_commands = transactions.add_subparsers(dest="transactions_command", required=True,
                                                       metavar="COMMAND")
    listing = command(transaction_commands, "list", "transactions_list",
                      "list transactions known to the coordinators")
    listing.add_argument("--state", action="append", default=[],
                         help="only transactions in this state, e.g. Ongoing (repeatable)")
    listing.add_argument("--producer-id", type=int, action="append", default=[],
                         help="only transactions of this producer id (repeatable)")
    listing.add_argument("--min-duration-ms", type=_non_negative_int, default=-1, metavar="MS",
                         help="only transactions open at least this long: the hanging ones")
    describe = command(transaction_commands, "describe", "transactions_describe",
                       "show a transaction's coordinator state")
    describe.add_argument("transactional_id", metavar="TXN_ID")
    abort = command(transaction_commands, "abort", "transactions_abort",
                    "abort a hanging transaction on one partition by writing an ABORT marker")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=_non_negative_int, required=True)
    abort.add_argument("--start-offset", type=_non_negative_int,
                       help="the open transaction's first offset; its producer is looked up with "
                            "DescribeProducers")
    abort.add_argument("--producer-id", type=int, help="instead of --start-offset: the producer id")
    abort.add_argument("--producer-epoch", type=int, help="instead of --start-offset: the producer epoch")
    abort.add_argument("--coordinator-epoch", type=int,
                       help="instead of --start-offset: the coordinator epoch")

    producers = commands.add_parser("producers", help="inspect producer state on partitions")
    producer_commands = producers.add_subparsers(dest="producers_command", required=True, metavar="COMMAND")
    describe = command(producer_commands, "describe", "producers_describe",
                       "show active producers of a topic's partitions (DescribeProducers)")
    describe.add_argument("topic")
    describe.add_argument("-p", "--partition", type=_non_negative_int, action="append",
                          help="partition to describe (repeatable; default all)")
    return topic_commands, command


# --- shared plumbing ---------------------------------------------------------------------

def _command(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn expected failures into one `ottla: ...` line and an exit code."""

    @functools.wraps(function)
    def run(args: argparse.Namespace) -> int:
        from confluent_kafka import KafkaException

        from .admin_client import ProtocolClientError

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
        from .admin_client import split_address

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
        """ListOffsets per partition; None where the partition has gone."""
        from confluent_kafka import KafkaError, TopicPartition

        wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not wanted:
            return {}
        options = {"request_timeout": self.timeout}
        if isolation is not None:
            options["isolation_level"] = isolation
        futures = self.admin().list_offsets(wanted, **options)
        result = {}
        for tp, future in futures.items():
            info = self.wait(future, "cannot list offsets", absent=KafkaError.UNKNOWN_TOPIC_OR_PART)
            result[tp.topic, tp.partition] = None if info is None else info.offset
        return result

    def require_apis(self, api_keys: Iterable[int], feature: str) -> None:
        """librdkafka waits until timeout for a coordinator that cannot exist; say so at once."""
        with self.protocol_client() as client:
            missing = client.missing_apis(api_keys)
        if missing:
            raise CommandFailed(f"broker at {self.bootstrap} does not support {feature} "
                                f"(missing {', '.join(missing)})")

    def protocol_client(self):
        from .admin_client import AdminProtocolClient

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


# --- topics ------------------------------------------------------------------------------

@_command
def topics_create(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    session = Session(args)
    admin = session.admin()
    session.metadata(admin)
    topic = NewTopic(args.name, num_partitions=args.partitions, replication_factor=args.replication_factor,
                     config=dict(args.config))
    future = admin.create_topics([topic], request_timeout=session.timeout,
                                 operation_timeout=session.timeout)[args.name]
    session.wait(future, f"cannot create topic {args.name!r}",
                 {KafkaError.TOPIC_ALREADY_EXISTS: f"topic {args.name!r} already exists"})
    print(f"created topic {args.name}")
    return 0


@_command
def topics_list(args: argparse.Namespace) -> int:
    session = Session(args)
    metadata = session.metadata(session.admin())
    rows = []
    for name in sorted(metadata.topics):
        partitions = metadata.topics[name].partitions
        replicas = max((len(p.replicas) for p in partitions.values()), default=0)
        rows.append((name, len(partitions), replicas))
    _print_table(["NAME", "PARTITIONS", "REPLICAS"], rows)
    return 0


@_command
def topics_describe(args: argparse.Namespace) -> int:
    from confluent_kafka import IsolationLevel, TopicCollection
    from confluent_kafka.admin import ConfigResource, ConfigSource, OffsetSpec, ResourceType

    session = Session(args)
    admin = session.admin()
    name = args.name
    session.require_topic(admin, name)
    description = session.wait(
        admin.describe_topics(TopicCollection([name]), request_timeout=session.timeout)[name],
        f"cannot describe topic {name!r}")
    resource = ConfigResource(ResourceType.TOPIC, name)
    configs = session.wait(admin.describe_configs([resource], request_timeout=session.timeout)[resource],
                           f"cannot describe configs of topic {name!r}")
    partitions = sorted(description.partitions, key=lambda p: p.id)
    keys = [(name, p.id) for p in partitions]
    log_start = session.offsets(keys, OffsetSpec.earliest())
    high_watermark = session.offsets(keys, OffsetSpec.latest())
    last_stable = session.offsets(keys, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)

    _print_fields([
        ("NAME", description.name),
        ("TOPIC-ID", description.topic_id),
        ("INTERNAL", str(description.is_internal).lower()),
        ("PARTITIONS", len(partitions)),
        ("REPLICAS", max((len(p.replicas) for p in partitions), default=0)),
    ])
    print()
    _print_table(
        ["PARTITION", "LEADER", "REPLICAS", "ISR", "LOG-START", "HIGH-WATERMARK", "LAST-STABLE"],
        [(p.id, p.leader.id if p.leader is not None else None,
          ",".join(str(node.id) for node in p.replicas), ",".join(str(node.id) for node in p.isr),
          log_start[name, p.id], high_watermark[name, p.id], last_stable[name, p.id]) for p in partitions])
    print()
    _print_table(["CONFIG", "VALUE", "SOURCE"],
                 [(entry.name, "<sensitive>" if entry.is_sensitive else entry.value,
                   ConfigSource(entry.source).name.lower()) for _, entry in sorted(configs.items())])
    return 0


@_command
def topics_alter_config(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    if not args.set and not args.delete:
        raise UsageError("give at least one --set KEY=VALUE or --delete KEY")
    session = Session(args)
    admin = session.admin()
    session.require_topic(admin, args.name)
    entries = [ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in args.set]
    entries += [ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE) for key in args.delete]
    resource = ConfigResource(ResourceType.TOPIC, args.name, incremental_configs=entries)
    future = admin.incremental_alter_configs([resource], request_timeout=session.timeout)[resource]
    session.wait(future, f"cannot alter configs of topic {args.name!r}",
                 {KafkaError.UNKNOWN_TOPIC_OR_PART: f"topic {args.name!r} does not exist"})
    print(f"updated {len(entries)} config(s) of topic {args.name}")
    return 0


@_command
def topics_delete(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError

    session = Session(args)
    admin = session.admin()
    session.metadata(admin)
    futures = admin.delete_topics(list(args.names), request_timeout=session.timeout,
                                  operation_timeout=session.timeout)
    failed = 0
    for name in args.names:
        try:
            session.wait(futures[name], f"cannot delete topic {name!r}",
                         {KafkaError.UNKNOWN_TOPIC_OR_PART: f"topic {name!r} does not exist"})
        except CommandFailed as exc:
            print(f"ottla: {exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"deleted topic {name}")
    return 1 if failed else 0


# --- produce -----------------------------------------------------------------------------

class _DeliveryTally:
    """Counts delivery reports; remembers the first failure to show the user."""

    def __init__(self):
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None

    def fail(self, reason: str) -> None:
        self.failed += 1
        if self.first_error is None:
            self.first_error = reason

    def __call__(self, error, message) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.fail(error.str())


@_command
def produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    session = Session(args)
    producer = session.producer({
        "acks": args.acks,
        "compression.type": args.compression,
        "message.timeout.ms": int(args.delivery_timeout * 1000),
        "linger.ms": 5,
    })
    metadata = session.require_topic(producer, args.topic)
    if args.partition is not None and args.partition not in metadata.partitions:
        raise CommandFailed(f"topic {args.topic!r} has no partition {args.partition}")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    options: dict[str, Any] = {"headers": [(key, value.encode()) for key, value in args.header] or None}
    if args.partition is not None:
        options["partition"] = args.partition
    tally = _DeliveryTally()
    for line in sys.stdin.buffer:
        value = line[:-1] if line.endswith(b"\n") else line
        key = None
        if separator is not None and separator in value:
            key, value = value.split(separator, 1)
        while True:
            try:
                producer.produce(args.topic, value, key, on_delivery=tally, **options)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: let deliveries drain
            except KafkaException as exc:
                tally.fail(exc.args[0].str())
                break
        producer.poll(0)
    undelivered = producer.flush(args.delivery_timeout + session.timeout)  # runs the callbacks
    tally.failed += undelivered
    print(f"produced {tally.delivered} record(s) to {args.topic}, {tally.failed} failed", file=sys.stderr)
    if tally.failed:
        reason = tally.first_error or f"not delivered within {args.delivery_timeout:g}s"
        print(f"ottla: first failure: {reason}", file=sys.stderr)
        return 1
    return 0


# --- consume -----------------------------------------------------------------------------

def _render_headers(message) -> bytes:
    return b",".join(key.encode() + b"=" + (value or b"") for key, value in message.headers() or ())


def _length(data: bytes | None) -> bytes:
    return str(-1 if data is None else len(data)).encode()


_FORMAT_FIELDS: dict[str, Callable[[Any], bytes]] = {
    "t": lambda m: m.topic().encode(),
    "p": lambda m: str(m.partition()).encode(),
    "o": lambda m: str(m.offset()).encode(),
    "k": lambda m: m.key() or b"",
    "v": lambda m: m.value() or b"",
    "T": lambda m: str(m.timestamp()[1]).encode(),
    "h": _render_headers,
    "K": lambda m: _length(m.key()),
    "S": lambda m: _length(m.value()),
}
_FORMAT_ESCAPES = {"n": b"\n", "t": b"\t", "\\": b"\\", "%": b"%"}


def compile_format(text: str) -> Callable[[Any], bytes]:
    """A kcat-style format as a function from a message to its output line."""
    parts: list[bytes | Callable[[Any], bytes]] = []
    for match in re.finditer(r"([%\\])(.)|[^%\\]+|.", text, re.DOTALL):
        marker, code = match.groups()
        if marker == "%" and code in _FORMAT_FIELDS:
            parts.append(_FORMAT_FIELDS[code])
        elif marker == "%" and code == "%" or marker == "\\" and code in _FORMAT_ESCAPES:
            parts.append(_FORMAT_ESCAPES[code])
        elif marker is None and match.group() not in ("%", "\\"):
            parts.append(match.group().encode())
        else:
            raise UsageError(f"unknown sequence {match.group()!r} in --format")

    def render(message) -> bytes:
        return b"".join(part if isinstance(part, bytes) else part(message) for part in parts) + b"\n"

    return render


def _consume_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        if args.print_keys or args.print_offsets:
            raise UsageError("--format cannot be combined with --print-keys or --print-offsets")
        return args.format
    return ("%p:%o\\t" if args.print_offsets else "") + ("%k\\t" if args.print_keys else "") + "%v"


@_command
def consume(args: argparse.Namespace) -> int:
    from confluent_kafka import TopicPartition

    render = compile_format(_consume_format(args))
    if args.offset == OFFSET_STORED and args.group is None:
        raise UsageError("-o stored needs --group: only a group has stored offsets")
    session = Session(args)
    consumer = session.consumer({
        # librdkafka insists on a group id; without --group nothing is ever committed under it.
        "group.id": args.group or f"{CLIENT_ID}-consume",
        "enable.auto.commit": args.group is not None,
        "isolation.level": args.isolation,
        "enable.partition.eof": args.exit_at_end,
        # Explicit offsets that fall outside the log are an error, not a silent jump.
        "auto.offset.reset": "earliest" if args.offset is None else "error",
    })
    try:
        metadata = session.require_topic(consumer, args.topic)
        if args.group is not None:
            session.require_apis(GROUP_MEMBER_APIS, "consumer groups")
        missing = sorted(set(args.partition or ()) - set(metadata.partitions))
        if missing:
            raise CommandFailed(f"topic {args.topic!r} has no partition {missing[0]}")
        assigned: set[tuple[str, int]] = set()
        if args.group is not None and not args.partition:
            positioned: set[tuple[str, int]] = set()

            def on_assign(consumer, partitions):
                assigned.update((tp.topic, tp.partition) for tp in partitions)
                if args.offset is not None:
                    # -o applies once per partition; after a rebalance, resume from the commit.
                    for tp in partitions:
                        if (tp.topic, tp.partition) not in positioned:
                            tp.offset = args.offset
                    positioned.update(assigned)
                    consumer.assign(partitions)

            def on_revoke(consumer, partitions):
                assigned.difference_update((tp.topic, tp.partition) for tp in partitions)

            consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
        else:
            default_start = OFFSET_STORED if args.group is not None else OFFSET_BEGINNING
            start = args.offset if args.offset is not None else default_start
            partitions = sorted(args.partition or metadata.partitions)
            consumer.assign([TopicPartition(args.topic, p, start) for p in partitions])
            assigned.update((args.topic, p) for p in partitions)
        signal.signal(signal.SIGTERM, _interrupt)
        _consume_loop(consumer, args, render, assigned)
    finally:
        consumer.close()
    return 0


def _interrupt(signum, frame):
    """SIGTERM stops a consumer like Ctrl-C does: it still commits and leaves its group."""
    raise KeyboardInterrupt


def _consume_loop(consumer, args: argparse.Namespace, render, assigned: set[tuple[str, int]]) -> None:
    from confluent_kafka import KafkaError

    out = sys.stdout.buffer
    at_end: set[tuple[str, int]] = set()
    received = 0
    try:
        while args.count is None or received < args.count:
            message = consumer.poll(0.2)
            if message is None:
                out.flush()
                continue
            error = message.error()
            where = (message.topic(), message.partition())
            if error is None:
                at_end.discard(where)
                out.write(render(message))
                received += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(where)
                if args.exit_at_end and assigned and at_end >= assigned:
                    break
            elif error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                raise CommandFailed(f"topic {args.topic!r} does not exist")
            elif error.code() == KafkaError._AUTO_OFFSET_RESET or error.fatal():
                raise CommandFailed(f"cannot consume {where[0]}-{where[1]}: {error.str()}")
            else:
                print(f"ottla: warning: {_strip_location(error.str())}", file=sys.stderr)
    except KeyboardInterrupt:
        pass  # Ctrl-C (or SIGTERM) is how a tailing consumer is meant to stop
    finally:
        out.flush()


# --- consumer groups ---------------------------------------------------------------------

def _render_assignment(assignment) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in assignment.topic_partitions if assignment is not None else ():
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{topic}:{','.join(map(str, sorted(ps)))}" for topic, ps in sorted(by_topic.items()))


@_command
def groups_list(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    session = Session(args)
    session.require_apis([LIST_GROUPS], "listing consumer groups")
    admin = session.admin()
    result = session.wait(admin.list_consumer_groups(request_timeout=session.timeout),
                          "cannot list consumer groups")
    # Per-broker failures; documented as KafkaException, though some versions give KafkaError.
    errors = [error.args[0] if isinstance(error, KafkaException) else error for error in result.errors]
    if errors and not result.valid:
        raise session.failure(KafkaException(errors[0]), "cannot list consumer groups")
    for error in errors:
        print(f"ottla: warning: {error.str()}", file=sys.stderr)
    _print_table(["GROUP", "STATE", "TYPE"],
                 [(g.group_id, g.state.name if g.state is not None else None,
                   g.type.name if g.type is not None else None)
                  for g in sorted(result.valid, key=lambda g: g.group_id)])
    return 0


@_command
def groups_describe(args: argparse.Namespace) -> int:
    session = Session(args)
    session.require_apis([FIND_COORDINATOR, DESCRIBE_GROUPS, OFFSET_FETCH], "describing consumer groups")
    admin = session.admin()
    for index, group in enumerate(args.groups):
        if index:
            print()
        _describe_group(session, admin, group)
    return 0


def _describe_group(session: Session, admin, group: str) -> None:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError
    from confluent_kafka.admin import OffsetSpec

    not_found = {KafkaError.GROUP_ID_NOT_FOUND: f"group {group!r} does not exist"}
    description = session.wait(
        admin.describe_consumer_groups([group], request_timeout=session.timeout)[group],
        f"cannot describe group {group!r}", not_found)
    if description.state == ConsumerGroupState.DEAD:
        raise CommandFailed(f"group {group!r} does not exist")
    committed = session.wait(
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                          request_timeout=session.timeout)[group],
        f"cannot fetch committed offsets of group {group!r}", not_found)
    owner: dict[tuple[str, int], str] = {}
    for member in description.members:
        for tp in member.assignment.topic_partitions if member.assignment is not None else ():
            owner[tp.topic, tp.partition] = member.member_id
    offsets = {(tp.topic, tp.partition): tp.offset for tp in committed.topic_partitions or ()}
    partitions = sorted(set(owner) | set(offsets))
    log_end = session.offsets(partitions, OffsetSpec.latest())

    coordinator = description.coordinator
    _print_fields([
        ("GROUP", description.group_id),
        ("STATE", description.state.name),
        ("COORDINATOR", f"{coordinator.id} ({coordinator.host}:{coordinator.port})" if coordinator else None),
        ("ASSIGNOR", description.partition_assignor or None),
        ("MEMBERS", len(description.members)),
    ])
    print()
    _print_table(["MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"],
                 [(m.member_id, m.client_id, m.host, _render_assignment(m.assignment) or None)
                  for m in description.members])
    print()
    rows = []
    for key in partitions:
        current = offsets.get(key)
        current = current if current is not None and current >= 0 else None
        end = log_end.get(key)
        lag = end - current if current is not None and end is not None else None
        rows.append((key[0], key[1], current, end, lag, owner.get(key)))
    _print_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID"], rows)


@_command
def groups_delete(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError

    session = Session(args)
    session.require_apis([FIND_COORDINATOR, DELETE_GROUPS], "deleting consumer groups")
    admin = session.admin()
    futures = admin.delete_consumer_groups(list(args.groups), request_timeout=session.timeout)
    failed = 0
    for group in args.groups:
        try:
            session.wait(futures[group], f"cannot delete group {group!r}", {
                KafkaError.GROUP_ID_NOT_FOUND: f"group {group!r} does not exist",
                KafkaError.NON_EMPTY_GROUP: f"group {group!r} still has members",
            })
        except CommandFailed as exc:
            print(f"ottla: {exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"deleted group {group}")
    return 1 if failed else 0


# --- transactions and producer state -----------------------------------------------------

@_command
def transactions_list(args: argparse.Namespace) -> int:
    with Session(args).protocol_client() as client:
        listings = client.list_transactions(states=args.state, producer_ids=args.producer_id,
                                            min_duration_ms=args.min_duration_ms)
    _print_table(["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
                 [(t.transactional_id, t.producer_id, t.transaction_state) for t in listings])
    return 0


def _utc(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat(timespec="milliseconds")


@_command
def transactions_describe(args: argparse.Namespace) -> int:
    from kio.schema.errors import ErrorCode

    from .admin_client import BrokerError

    with Session(args).protocol_client() as client:
        try:
            coordinator, state = client.describe_transaction(args.transactional_id)
        except BrokerError as exc:
            if exc.code == ErrorCode.transactional_id_not_found:
                raise CommandFailed(f"transaction {args.transactional_id!r} does not exist") from None
            raise
    partitions = [f"{topic.topic}-{partition}" for topic in state.topics for partition in topic.partitions]
    _print_fields([
        ("TRANSACTIONAL-ID", state.transactional_id),
        ("COORDINATOR", f"{coordinator.node_id} ({coordinator.address})"),
        ("STATE", state.transaction_state),
        ("PRODUCER-ID", state.producer_id),
        ("PRODUCER-EPOCH", state.producer_epoch),
        ("TIMEOUT-MS", int(state.transaction_timeout.total_seconds() * 1000)),
        ("START-TIME", _utc(state.transaction_start_time)),
        ("PARTITIONS", ", ".join(partitions) or None),
    ])
    return 0


@_command
def transactions_abort(args: argparse.Namespace) -> int:
    explicit = {"--producer-id": args.producer_id, "--producer-epoch": args.producer_epoch,
                "--coordinator-epoch": args.coordinator_epoch}
    given = [flag for flag, value in explicit.items() if value is not None]
    if args.start_offset is not None and given:
        raise UsageError(f"--start-offset cannot be combined with {', '.join(given)}")
    if args.start_offset is None and len(given) != len(explicit):
        raise UsageError("give --start-offset, or all of --producer-id, --producer-epoch "
                         "and --coordinator-epoch")
    where = f"{args.topic}-{args.partition}"
    with Session(args).protocol_client() as client:
        if args.start_offset is None:
            producer_id, producer_epoch = args.producer_id, args.producer_epoch
            coordinator_epoch = args.coordinator_epoch
        else:
            active = client.describe_producers(args.topic, [args.partition]).get(args.partition, ())
            matches = [p for p in active if p.current_txn_start_offset == args.start_offset]
            if not matches:
                raise CommandFailed(f"no open transaction starts at offset {args.start_offset} on {where}")
            producer_id, producer_epoch = matches[0].producer_id, matches[0].producer_epoch
            # A producer whose coordinator never wrote a marker here reports epoch -1.
            coordinator_epoch = max(0, matches[0].coordinator_epoch)
        client.abort_transaction(args.topic, args.partition, producer_id=producer_id,
                                 producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch)
    print(f"aborted the transaction of producer {producer_id} (epoch {producer_epoch}) on {where}")
    return 0


@_command
def producers_describe(args: argparse.Namespace) -> int:
    with Session(args).protocol_client() as client:
        by_partition = client.describe_producers(args.topic, args.partition)
    rows = []
    for partition, producers in by_partition.items():
        for p in producers:
            rows.append((partition, p.producer_id, p.producer_epoch, p.last_sequence,
                         p.last_timestamp if p.last_timestamp >= 0 else None, p.coordinator_epoch,
                         p.current_txn_start_offset if p.current_txn_start_offset >= 0 else None))
    _print_table(["PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP",
                  "COORDINATOR-EPOCH", "TXN-START-OFFSET"], rows)
    return 0
