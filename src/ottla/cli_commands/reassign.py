"""`ottla topics reassign` and `ottla topics reassignments`: AlterPartitionReassignments and
ListPartitionReassignments through `ottla.admin_client`, since confluent-kafka has neither."""

from __future__ import annotations

import argparse

from .common import Session, UsageError, _command, _non_negative_int, _print_table


def _broker_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected broker ids like 1,2,3, got {text!r}") from None
    if len(set(ids)) != len(ids) or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"broker ids must be distinct and not negative: {text}")
    return ids


def register(topic_commands, command) -> None:
    reassign = command(topic_commands, "reassign", f"{__name__}:topics_reassign",
                       "move a partition's replicas (AlterPartitionReassignments), or cancel a move")
    reassign.add_argument("name")
    reassign.add_argument("-p", "--partition", type=_non_negative_int, required=True)
    reassign.add_argument("--replicas", type=_broker_ids, metavar="ID,ID,...",
                          help="the new replica list, preferred leader first")
    reassign.add_argument("--cancel", action="store_true", help="cancel the ongoing reassignment")
    command(topic_commands, "reassignments", f"{__name__}:topics_reassignments",
            "list ongoing partition reassignments (ListPartitionReassignments)")


@_command
def topics_reassign(args: argparse.Namespace) -> int:
    if args.cancel == (args.replicas is not None):
        raise UsageError("give --replicas ID,ID,... or --cancel")
    session = Session(args)
    with session.protocol_client() as client:
        client.metadata([args.name])  # "topic ... does not exist" before asking the controller
        client.alter_partition_reassignment(args.name, args.partition, args.replicas,
                                            int(session.timeout * 1000))
    where = f"{args.name}-{args.partition}"
    if args.cancel:
        print(f"cancelled the reassignment of {where}")
    else:
        print(f"reassigning {where} to replicas {','.join(map(str, args.replicas))}")
    return 0


@_command
def topics_reassignments(args: argparse.Namespace) -> int:
    session = Session(args)
    with session.protocol_client() as client:
        ongoing = client.list_partition_reassignments(int(session.timeout * 1000))
    _print_table(["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"],
                 [(topic, p.partition_index, ",".join(map(str, p.replicas)) or None,
                   ",".join(map(str, p.adding_replicas)) or None,
                   ",".join(map(str, p.removing_replicas)) or None) for topic, p in ongoing])
    return 0
