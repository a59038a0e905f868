"""`ottla transactions list|describe|abort` and `ottla producers describe`, through
`ottla.admin_client` since librdkafka lacks these admin APIs."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from .common import CommandFailed, Session, UsageError, _command, _non_negative_int, _print_fields, _print_table


def register(commands, command):
    transactions = commands.add_parser("transactions", help="inspect transactions and abort hanging ones")
    transaction_commands = transactions.add_subparsers(dest="transactions_command", required=True,
                                                       metavar="COMMAND")
    listing = command(transaction_commands, "list", f"{__name__}:transactions_list",
                      "list transactions known to the coordinators")
    listing.add_argument("--state", action="append", default=[],
                         help="only transactions in this state, e.g. Ongoing (repeatable)")
    listing.add_argument("--producer-id", type=int, action="append", default=[],
                         help="only transactions of this producer id (repeatable)")
    listing.add_argument("--min-duration-ms", type=_non_negative_int, default=-1, metavar="MS",
                         help="only transactions open at least this long: the hanging ones")
    describe = command(transaction_commands, "describe", f"{__name__}:transactions_describe",
                       "show a transaction's coordinator state")
    describe.add_argument("transactional_id", metavar="TXN_ID")
    abort = command(transaction_commands, "abort", f"{__name__}:transactions_abort",
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
    describe = command(producer_commands, "describe", f"{__name__}:producers_describe",
                       "show active producers of a topic's partitions (DescribeProducers)")
    describe.add_argument("topic")
    describe.add_argument("-p", "--partition", type=_non_negative_int, action="append",
                          help="partition to describe (repeatable; default all)")


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

    from ..admin_client import BrokerError

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
