"""The `ottla` command line: `serve` runs a broker; the other commands are Kafka clients."""

from __future__ import annotations

import argparse
import sys


def build_parser(client_commands: bool = True) -> argparse.ArgumentParser:
    """`client_commands=False` leaves out the client commands: `ottla serve` does not need
    them, and importing their modules was a share of every broker start."""
    parser = argparse.ArgumentParser(prog="ottla", description="Kafka-compatible streaming log broker")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run a broker in the foreground")
    serve.add_argument("--data-dir", default="./ottla-data", help="where logs live (default ./ottla-data)")
    serve.add_argument("--listen", default="127.0.0.1:9092", help="HOST:PORT to listen on (default 127.0.0.1:9092)")
    serve.add_argument("--advertised", help="HOST:PORT clients should use, if not the listen address")
    serve.add_argument("--node-id", type=int, help="this broker's node id (default 0)")
    serve.add_argument("--config", action="append", metavar="KEY=VALUE",
                       help="a Kafka broker config, e.g. num.partitions=3 (repeatable)")
    serve.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--ready-file", help="write HOST:PORT here once listening (for embedding)")
    serve.set_defaults(run="ottla.server.main:run")

    if client_commands:
        from .cli_commands import add_commands

        add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    serve = (sys.argv[1:] if argv is None else argv)[:1] == ["serve"]
    if serve and "hypothesis" not in sys.modules:
        # kio registers its types with Hypothesis whenever it is installed (a test dependency);
        # a broker never uses it, and importing it took 0.1-1 s of every start.
        sys.modules["hypothesis"] = None
    parser = build_parser(client_commands=not serve)
    args = parser.parse_args(argv)
    module_name, _, function = args.run.partition(":")
    module = __import__(module_name, fromlist=[function])
    return getattr(module, function)(args)


if __name__ == "__main__":
    sys.exit(main())
