"""`ottla serve`: run one broker in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import resource
import sys
import time

from ..cluster.membership import ClusterMembership
from ..cluster.store import StoreError
from ..config import BrokerConfig, ConfigError, report_not_applied_broker_configs
from .broker import Broker
from .event_loop import new_event_loop
from .heap import keep_freed_request_buffers
from .loop_lag import GcPauses, LoopLag, steps_summary


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} expects HOST:PORT, got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what} expects HOST:PORT with a numeric port, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} is out of range")
    return host.strip("[]"), number


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as Kafka's start scripts ask operators to:
    every partition being written holds a descriptor, and a 1,024 soft limit is common. Returns
    (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel caps lower
            logging.getLogger("ottla.broker").warning("cannot raise the open files limit from %d to %s: %s",
                                                      soft, hard, exc)
    return soft, hard


def seconds_since_process_start() -> float | None:
    """Since the kernel started this process: interpreter start and imports included, which a
    clock read in `main` would miss. None where /proc is not Linux's."""
    try:
        fields = open("/proc/self/stat").read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22 of proc(5)
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def configure_logging(level: str) -> None:
    """One line per event, key=value friendly, on stderr; quiet (WARNING) by default."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )


def run(args) -> int:
    configure_logging(args.log_level)
    keep_freed_request_buffers()
    raise_open_files_limit()
    try:
        overrides = BrokerConfig.parse_cli(args.config or [])
        if args.node_id is not None:
            overrides["node.id"] = str(args.node_id)
        config = BrokerConfig(overrides)
        report_not_applied_broker_configs(config)
        host, port = parse_address(args.listen, "--listen")
        advertised = parse_address(args.advertised, "--advertised") if args.advertised else None
    except ConfigError as exc:
        print(f"ottla serve: {exc}", file=sys.stderr)
        return 2

    try:
        membership = ClusterMembership.join(config)  # blocking: before the event loop runs
    except StoreError as exc:
        print(f"ottla serve: {exc}", file=sys.stderr)
        return 1

    async def main() -> None:
        try:
            broker = Broker(args.data_dir, config, host=host, port=port, advertised=advertised,
                            membership=membership)
        except BaseException:
            if membership is not None:
                membership.close()
            raise
        await broker.start()
        lag.start()
        gc_pauses = GcPauses()
        gc.callbacks.append(gc_pauses)
        broker.stop_on_signals()
        if await broker.ready():
            # What start-up made (the protocol schema classes, the logs and their indexes) lives
            # as long as the broker: out of the collector's reach, a full collection no longer
            # walks it while a request waits (fuzzing saw 371 ms full collections).
            gc.freeze()
            started = seconds_since_process_start()
            print(f"ottla: broker {broker.node_id} serving on {broker.host}:{broker.port}, data in {broker.data_dir}"
                  + ("" if started is None else f" (started in {started:.2f} s)"), file=sys.stderr, flush=True)
            if args.ready_file:
                _write_ready_file(args.ready_file, broker.host, broker.port)
        await broker.serve_forever()
        logging.getLogger("ottla.loop").info("event loop: worst lag %.0f ms, worst CPU between two wake-ups %.0f ms",
                                             lag.worst_ms, lag.worst_cpu_ms)
        logging.getLogger("ottla.loop").info("event loop: longest single steps: %s; longest garbage "
                                             "collections: %s", steps_summary(), gc_pauses.summary())

    try:
        lag = LoopLag()
        with asyncio.Runner(loop_factory=functools.partial(new_event_loop, probe=lag)) as runner:
            runner.run(main())
    except (OSError, StoreError) as exc:
        print(f"ottla serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _write_ready_file(path: str, host: str, port: int) -> None:
    """Embedders (ottla.testing) learn the bound port from this file once we accept connections."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(f"{host}:{port}\n")
    os.replace(tmp, path)
