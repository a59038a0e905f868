"""`ottla cluster describe` and `ottla cluster elect-leaders`.

`describe` reads one Metadata response through `ottla.admin_client` (librdkafka exposes neither
racks, leader epochs nor offline replicas); `elect-leaders` uses confluent-kafka's
`AdminClient.elect_leaders` (ElectLeaders), which librdkafka has had since 2.4.
"""

from __future__ import annotations

import argparse
import sys

from .common import CommandFailed, Session, UsageError, _command, _non_negative_int, _print_fields, _print_table
from .partitions import OFFLINE, UNDER_REPLICATED, _ids, states_of


def register(commands, command) -> None:
    cluster = commands.add_parser("cluster", help="describe the cluster and elect partition leaders")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    command(cluster_commands, "describe", f"{__name__}:cluster_describe",
            "show the cluster id, the controller, the brokers and the under-replicated and offline partitions")
    elect = command(cluster_commands, "elect-leaders", f"{__name__}:cluster_elect_leaders",
                    "elect partition leaders (ElectLeaders), as kafka-leader-election does")
    elect.add_argument("--type", choices=["preferred", "unclean"], default="preferred",
                       help="preferred: move leadership to the first replica if it is in the ISR; "
                            "unclean: elect any live replica of a partition without leader")
    elect.add_argument("--topic", help="the partition's topic (with --partition)")
    elect.add_argument("--partition", type=_non_negative_int, help="the partition (with --topic)")
    elect.add_argument("--all", action="store_true", help="every partition of the cluster")


@_command
def cluster_describe(args: argparse.Namespace) -> int:
    session = Session(args)
    with session.protocol_client() as client:
        response = client.metadata_response(None)
    states = states_of(response)
    under = [s for s in states if s.status == UNDER_REPLICATED]
    offline = [s for s in states if s.status == OFFLINE]
    controller = response.controller_id
    _print_fields([
        ("CLUSTER-ID", response.cluster_id),
        ("CONTROLLER", controller if controller >= 0 else None),
        ("BROKERS", len(response.brokers)),
        ("TOPICS", len(response.topics)),
        ("PARTITIONS", len(states)),
        ("UNDER-REPLICATED", len(under)),
        ("OFFLINE", len(offline)),
    ])
    print()
    _print_table(["BROKER", "HOST:PORT", "RACK", "CONTROLLER"],
                 [(b.node_id, f"{b.host}:{b.port}", b.rack, "yes" if b.node_id == controller else None)
                  for b in sorted(response.brokers, key=lambda b: b.node_id)])
    if under or offline:
        print()
        _print_table(["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "OFFLINE", "STATUS"],
                     [(s.topic, s.partition, s.leader if s.leader >= 0 else None, _ids(s.replicas), _ids(s.isr),
                       _ids(s.offline), s.status) for s in offline + under])
    return 0


@_command
def cluster_elect_leaders(args: argparse.Namespace) -> int:
    from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition

    if args.all == (args.topic is not None) or (args.topic is None) != (args.partition is None):
        raise UsageError("give --topic and --partition, or --all")
    election = ElectionType.PREFERRED if args.type == "preferred" else ElectionType.UNCLEAN
    session = Session(args)
    admin = session.admin()
    session.metadata(admin)
    wanted = None if args.all else [TopicPartition(args.topic, args.partition)]
    # confluent-kafka 2.16's binding rejects every option (request_timeout raises SystemError);
    # session.wait bounds the wait instead.
    results = session.wait(admin.elect_leaders(election, wanted),
                           "cannot elect leaders")
    elected, not_needed, failed = [], [], []
    for tp, error in sorted(results.items(), key=lambda item: (item[0].topic, item[0].partition)):
        error = error.args[0] if isinstance(error, KafkaException) else error
        name = f"{tp.topic}-{tp.partition}"
        if error is None or error.code() == KafkaError.NO_ERROR:
            elected.append(name)
        elif error.code() == KafkaError.ELECTION_NOT_NEEDED:
            not_needed.append(name)
        else:
            failed.append((name, error))
    kind = args.type.upper()
    # kafka-leader-election's wording, so scripts written for it read ours.
    if elected:
        print(f"Successfully completed leader election ({kind}) for partitions {', '.join(elected)}")
    if not_needed:
        print(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    if not elected and not not_needed and not failed:
        print(f"No partitions for leader election ({kind})")
    for name, error in failed:
        print(f"ottla: leader election ({kind}) failed for {name}: {error.name()}: {error.str()}",
              file=sys.stderr)
    if failed:
        raise CommandFailed(f"{len(failed)} partition(s) failed leader election")
    return 0
