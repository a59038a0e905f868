"""`ottla topics create|list|describe|alter-config|delete`."""

from __future__ import annotations

import argparse
import sys

from .common import CommandFailed, Session, UsageError, _command, _key_value, _positive_int, _print_fields, _print_table
from .partitions import OFFLINE, UNDER_REPLICATED, _ids, partition_states, states_of


def register(commands, command):
    """Add the `topics` group; returns its subcommands for commands kept in other modules."""
    topics = commands.add_parser("topics", help="create, list, describe, reconfigure and delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = command(topic_commands, "create", f"{__name__}:topics_create", "create a topic")
    create.add_argument("name")
    create.add_argument("-p", "--partitions", type=_positive_int, default=-1,
                        help="number of partitions (default: the broker's num.partitions)")
    create.add_argument("-r", "--replication-factor", type=_positive_int, default=-1,
                        help="replicas per partition (default: the broker's default)")
    create.add_argument("-c", "--config", type=_key_value, action="append", default=[],
                        metavar="KEY=VALUE", help="a topic config, e.g. cleanup.policy=compact (repeatable)")
    command(topic_commands, "list", f"{__name__}:topics_list", "list topics")
    describe = command(topic_commands, "describe", f"{__name__}:topics_describe",
                       "show a topic's partitions, offsets and configs (every topic's without a name)")
    describe.add_argument("name", nargs="?", help="the topic (default: every topic, internal ones too)")
    describe.add_argument("--under-replicated-partitions", action="store_true",
                          help="only partitions whose ISR is smaller than their replicas")
    describe.add_argument("--unavailable-partitions", action="store_true",
                          help="only partitions without a live leader")
    alter = command(topic_commands, "alter-config", f"{__name__}:topics_alter_config",
                    "set or delete topic configs (IncrementalAlterConfigs)")
    alter.add_argument("name")
    alter.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="set a config (repeatable)")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       help="revert a config to its default (repeatable)")
    delete = command(topic_commands, "delete", f"{__name__}:topics_delete", "delete topics")
    delete.add_argument("names", nargs="+", metavar="NAME")
    return topic_commands


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
    """One topic, or as `kafka-topics.sh --describe` without `--topic` every topic in name order
    (a topic deleted meanwhile is left out; with a partition filter, so is a topic none of whose
    partitions it keeps)."""
    from confluent_kafka import IsolationLevel, KafkaError, TopicCollection
    from confluent_kafka.admin import ConfigResource, OffsetSpec, ResourceType

    session = Session(args)
    admin = session.admin()
    if args.name is None:
        names = sorted(session.metadata(admin).topics)
        if not names:
            return 0
    else:
        session.require_topic(admin, args.name)
        names = [args.name]
    gone = None if args.name is not None else KafkaError.UNKNOWN_TOPIC_OR_PART
    described = admin.describe_topics(TopicCollection(names), request_timeout=session.timeout)
    resources = {name: ConfigResource(ResourceType.TOPIC, name) for name in names}
    configs_asked = admin.describe_configs(list(resources.values()), request_timeout=session.timeout)
    topics = []
    with session.protocol_client() as client:
        states: dict[str, list] = {}
        for state in (partition_states(client, args.name) if args.name is not None  # raises the topic's error
                      else states_of(client.metadata_response(names))):  # one Metadata for them all
            states.setdefault(state.topic, []).append(state)
        for name in names:
            description = session.wait(described[name], f"cannot describe topic {name!r}", absent=gone)
            configs = session.wait(configs_asked[resources[name]], f"cannot describe configs of topic {name!r}",
                                   absent=gone)
            if description is None or configs is None:
                continue
            partitions = [p for p in states.get(name, ())
                          if (not args.under_replicated_partitions or p.status == UNDER_REPLICATED)
                          and (not args.unavailable_partitions or p.status == OFFLINE)]
            if args.name is None and not partitions and (args.under_replicated_partitions
                                                         or args.unavailable_partitions):
                continue
            compacted = "compact" in getattr(configs.get("cleanup.policy"), "value", "")
            dirty = _dirty_ratios(client, name, partitions) if compacted else None
            topics.append((description, configs, partitions, dirty))
    keys = [(d.name, p.partition) for d, _, partitions, _ in topics for p in partitions if p.leader >= 0]
    offsets = (session.offsets(keys, OffsetSpec.earliest()), session.offsets(keys, OffsetSpec.latest()),
               session.offsets(keys, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED))
    for i, topic in enumerate(topics):
        if i:
            print()
        _print_topic(*topic, offsets)
    return 0


def _print_topic(description, configs, partitions, dirty: dict[int, str] | None, offsets) -> None:
    """A topic's fields, its partitions (DIRTY-RATIO for a compacted topic) and its configs."""
    from confluent_kafka.admin import ConfigSource

    name = description.name
    log_start, high_watermark, last_stable = offsets
    _print_fields([
        ("NAME", name),
        ("TOPIC-ID", description.topic_id),
        ("INTERNAL", str(description.is_internal).lower()),
        ("PARTITIONS", len(description.partitions)),
        ("REPLICAS", max((len(p.replicas) for p in description.partitions), default=0)),
    ])
    print()
    _print_table(
        ["PARTITION", "LEADER", "LEADER-EPOCH", "REPLICAS", "ISR", "OFFLINE", "LOG-START", "HIGH-WATERMARK",
         "LAST-STABLE", "STATUS"] + (["DIRTY-RATIO"] if dirty is not None else []),
        [(p.partition, p.leader if p.leader >= 0 else None, p.leader_epoch, _ids(p.replicas), _ids(p.isr),
          _ids(p.offline), log_start.get((name, p.partition)), high_watermark.get((name, p.partition)),
          last_stable.get((name, p.partition)), p.status) + ((dirty.get(p.partition),) if dirty is not None else ())
         for p in partitions])
    print()
    _print_table(["CONFIG", "VALUE", "SOURCE"],
                 [(entry.name, "<sensitive>" if entry.is_sensitive else entry.value,
                   ConfigSource(entry.source).name.lower()) for _, entry in sorted(configs.items())])


def _dirty_ratios(client, name: str, partitions) -> dict[int, str]:
    """partition -> the leader's dirty ratio of a compacted partition, as shown (4 decimals);
    empty when the brokers cannot say (not Ottla, or no flexible DescribeLogDirs)."""
    from ..admin_client import UnsupportedByBroker

    try:
        ratios = client.dirty_ratios(name, {p.partition: p.leader for p in partitions if p.leader >= 0})
    except UnsupportedByBroker:
        return {}
    return {partition: f"{ratio:.4f}" for partition, ratio in ratios.items()}


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
