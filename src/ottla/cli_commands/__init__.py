"""The client commands of `ottla`, one module per command group; `common` holds what they share."""

from __future__ import annotations

import argparse
import os

from . import cluster, groups, produce_consume, reassign, records, topics, transactions
from .common import DEFAULT_BOOTSTRAP, _positive_float


def add_commands(commands) -> None:
    """Register every client command under the `ottla` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-b", "--bootstrap-server", metavar="HOST:PORT",
                        default=os.environ.get("OTTLA_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
                        help="broker to contact (default $OTTLA_BOOTSTRAP or 127.0.0.1:9092)")
    common.add_argument("--timeout", type=_positive_float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the broker (default 5)")

    def command(parent, name: str, run: str, help: str) -> argparse.ArgumentParser:
        """A subcommand taking the common options; `run` is "module:function"."""
        parser = parent.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(run=run)
        return parser

    topic_commands = topics.register(commands, command)
    records.register(topic_commands, command)
    reassign.register(topic_commands, command)
    produce_consume.register(commands, command)
    groups.register(commands, command)
    transactions.register(commands, command)
    cluster.register(commands, command)
