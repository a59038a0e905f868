"""`ottla produce` and `ottla consume`: stdin lines to records, records to stdout lines."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from typing import Any, Callable

from .common import (CLIENT_ID, GROUP_MEMBER_APIS, OFFSET_BEGINNING, OFFSET_STORED, CommandFailed, Session,
                     UsageError, _command, _key_value, _non_negative_int, _positive_float, _positive_int,
                     _start_offset, _strip_location)


def register(commands, command):
    produce = command(commands, "produce", f"{__name__}:produce", "produce stdin lines as records, one per line")
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

    consume = command(commands, "consume", f"{__name__}:consume", "print records to stdout, one per line")
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
