"""`ottla groups list|describe|delete`."""

from __future__ import annotations

import argparse
import sys

from .common import (DELETE_GROUPS, DESCRIBE_GROUPS, FIND_COORDINATOR, LIST_GROUPS, OFFSET_FETCH,
                     CommandFailed, Session, _command, _print_fields, _print_table)


def register(commands, command):
    groups = commands.add_parser("groups", help="list, describe and delete consumer groups")
    group_commands = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND")
    command(group_commands, "list", f"{__name__}:groups_list", "list consumer groups")
    describe = command(group_commands, "describe", f"{__name__}:groups_describe",
                       "show a group's members, committed offsets and lag")
    describe.add_argument("groups", nargs="+", metavar="GROUP")
    delete = command(group_commands, "delete", f"{__name__}:groups_delete", "delete empty consumer groups")
    delete.add_argument("groups", nargs="+", metavar="GROUP")


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
