"""Crash points for process-level tests: `OTTLA_FAILPOINTS` (comma-separated names), read once
when the broker starts so an unset variable costs nothing on any hot path.

The names (each defined where it fires):
- `cleaner.after_cleaned`, `cleaner.after_swap_files`, `cleaner.after_old_deleted`,
  `cleaner.after_swap_complete`: the log cleaner's swap (`log/cleaner/swap.py`);
- `txn.after_prepare_commit`: a PrepareCommit is durable, no marker written yet
  (`coordinator/transaction/service.py`);
- `replica.after_follower_append`: a follower appended what a Fetch answer carried and is about
  to take a higher HW from it (`server/replica_fetcher.py`), seed 001's follower crash;
- `replica.hold_high_watermark`: not a crash: a follower never takes a higher HW from its
  leader's Fetch answers (`server/replica_fetcher.py`), so elected it leads with its HW below
  the start of its epoch (KIP-207);
- `leader_epoch.hold_write`: not a crash: a new leader's leader-epoch checkpoint, left to the
  disk worker, is never written by it (`log/log.py`), so a test's kill -9 lands in that window;
- `shutdown.hold_after_controlled_shutdown`: not a crash: a SIGTERMed broker waits a second
  after its ControlledShutdown succeeded before it stops (`server/cluster_node.py`);
- `fsync.eio@TEXT`: every sync of a file whose path contains TEXT fails with EIO
  (`durability.py`).
"""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["from_environment", "crash_at"]

log = logging.getLogger("ottla.failpoints")


def from_environment() -> frozenset[str]:
    return frozenset(name.strip() for name in os.environ.get("OTTLA_FAILPOINTS", "").split(",") if name.strip())


def crash_at(name: str, failpoints: frozenset[str]) -> None:
    """kill -9 this process if `name` is armed: the crash must look like any other."""
    if name in failpoints:
        log.warning("failpoint %s: killing the broker", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
