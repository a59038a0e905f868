"""`ottla topics delete-records`: DeleteRecords through confluent-kafka's admin client."""

from __future__ import annotations

import argparse

from .common import OFFSET_END, CommandFailed, Session, _command, _non_negative_int, _print_table


def _before_offset(text: str) -> int:
    """An offset, or end/high-watermark for everything up to the high watermark."""
    if text in ("end", "high-watermark"):
        return OFFSET_END
    return _non_negative_int(text)


def register(topic_commands, command) -> None:
    delete_records = command(topic_commands, "delete-records", f"{__name__}:topics_delete_records",
                             "delete the records before an offset (DeleteRecords): the log start "
                             "offset moves there")
    delete_records.add_argument("name")
    delete_records.add_argument("-p", "--partition", type=_non_negative_int, action="append",
                                help="partition (repeatable; default all)")
    delete_records.add_argument("--before", type=_before_offset, required=True, metavar="OFFSET",
                                help="first offset to keep, or 'end' for the high watermark")


@_command
def topics_delete_records(args: argparse.Namespace) -> int:
    from confluent_kafka import TopicPartition

    session = Session(args)
    admin = session.admin()
    metadata = session.require_topic(admin, args.name)
    partitions = sorted(args.partition or metadata.partitions)
    missing = [p for p in partitions if p not in metadata.partitions]
    if missing:
        raise CommandFailed(f"topic {args.name!r} has no partition {missing[0]}")
    futures = admin.delete_records([TopicPartition(args.name, p, args.before) for p in partitions],
                                   request_timeout=session.timeout, operation_timeout=session.timeout)
    rows = []
    for tp, future in sorted(futures.items(), key=lambda item: item[0].partition):
        deleted = session.wait(future, f"cannot delete records of {args.name}-{tp.partition}")
        rows.append((tp.partition, deleted.low_watermark))
    _print_table(["PARTITION", "LOG-START"], rows)
    return 0
