"""The log cleaner: `log.cleaner.threads` threads that each pick the filthiest compacted log,
clean it off the event loop and swap the result in (Kafka's LogCleaner and LogCleanerManager).

Who touches what:
- `Log` objects, the `LogManager` and this class's checkpoint and horizon maps belong to the
  event loop thread (the owner). A cleaner thread reaches them only through `run_on_owner`,
  which runs a function on the owner and waits for it: once to choose a log and snapshot
  it into a `CleanTask` (segment paths and sizes, offsets, aborted transactions, producers'
  last batches), once to swap the cleaned segments in (`swap.commit_swap`: a few renames and
  two directory fsyncs, then a list update). Nothing else ever locks or waits on the owner.
- In between, the thread reads only sealed segment files, which never change once rolled
  (retention or truncation may unlink them: the read keeps its descriptor, or fails and the
  pass is dropped), and writes only its own `.cleaned` files. The commit checks that every
  segment it read is still the same object in the log, else it changes nothing.
- The pass itself runs in a worker process the thread spawns for it (at nice 10), so decoding
  records in Python never holds the event loop's interpreter lock and the broker gets the CPU
  first on a busy machine; the thread waits for its result. Each worker throttles its reads
  and writes to its share of `log.cleaner.io.max.bytes.per.second`. `stop` kills a worker
  mid-pass; that leaves only `.cleaned` files, removed by the thread or at the next load.

A log is cleaned when its dirty ratio (bytes in [first dirty, first uncleanable) over bytes
from the log start to the first uncleanable offset) exceeds `min.cleanable.dirty.ratio`,
when its oldest dirty record passed `max.compaction.lag.ms`, or when a delete horizon it holds
(tombstones, markers) has passed. The first uncleanable offset is the lowest of the active
segment's base, the last stable offset, and the first segment with a record newer than
`min.compaction.lag.ms`. After a pass the first dirty offset is checkpointed in
`cleaner-offset-checkpoint` (Kafka's format).
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

from ...durability import LogDirOffline, failed_elsewhere
from ...failpoints import crash_at
from ..manager import read_offset_checkpoint, write_offset_checkpoint
from ..txn_index import AbortedTxn
from .clean import (
    CleaningAborted,
    CleanResult,
    CleanTask,
    SegmentInfo,
    Throttler,
    clean,
    discard,
    run_in_worker,
)
from .filter import OffsetMap
from .swap import commit_swap, remove_files

if TYPE_CHECKING:
    from ...config import BrokerConfig
    from ..log import Log
    from ..manager import LogManager
    from ..segment import LogSegment

__all__ = ["LogCleaner", "CLEANER_CHECKPOINT_FILE", "DirtyStats", "compacted"]

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"


class DirtyStats(NamedTuple):
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    must_clean: bool  # max.compaction.lag.ms passed, or a delete horizon did

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def compacted(log_: "Log") -> bool:
    """The cleaner looks at this log (its dirty ratio reads the LSO, so the producer state)."""
    return "compact" in log_.config["cleanup.policy"]


class _Grabbed(NamedTuple):
    key: tuple[str, int]
    log: "Log"
    task: CleanTask
    expected: dict[int, "LogSegment"]


class LogCleaner:
    def __init__(self, manager: "LogManager", config: "BrokerConfig", *, clock: Callable[[], int],
                 failpoints: frozenset[str] = frozenset(),
                 load_in_steps: Callable[["Log"], None] | None = None):
        """`load_in_steps(log)` starts loading a log's producer state in steps on the owner,
        without waiting (the server's `steps.load_producer_state_soon`): a compacted log whose
        state is not loaded is looked at in a later round. Without it (a cleaner driven directly
        by tests) the dirty-ratio check loads the state in one piece."""
        self._manager = manager
        self._load_in_steps = load_in_steps
        self._clock = clock
        self._failpoints = failpoints
        self.threads = config["log.cleaner.threads"]
        self.enabled = config["log.cleaner.enable"] and self.threads > 0
        self.reconfigure(config)
        self._checkpoint_path = Path(manager.data_dir) / CLEANER_CHECKPOINT_FILE
        self._checkpoints: dict[tuple[str, int], int] = read_offset_checkpoint(self._checkpoint_path)
        self._horizons: dict[tuple[str, int], int] = {}
        self._logs_seen: dict[tuple[str, int], "Log"] = {}  # whose log the checkpoint speaks for
        self._in_progress: set[tuple[str, int]] = set()
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_versions = itertools.count(1)
        self._written_version = 0
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self.last_results: dict[tuple[str, int], CleanResult] = {}
        manager.deletion_listeners.append(self._forget)

    def reconfigure(self, config: "BrokerConfig") -> None:
        """The settings each pass reads (dynamic broker configs): they apply from the next pass."""
        self._map_memory = config["log.cleaner.dedupe.buffer.size"] // max(1, self.threads)
        self._load_factor = config["log.cleaner.io.buffer.load.factor"]
        self._backoff_s = config["log.cleaner.backoff.ms"] / 1000
        self._io_rate = config["log.cleaner.io.max.bytes.per.second"]
        self._throttler = Throttler(self._io_rate)  # for passes run in the calling thread

    # -- owner thread ------------------------------------------------------------------------

    def dirty_stats(self, key: tuple[str, int], log_: "Log", now_ms: int) -> DirtyStats | None:
        """Where the clean and dirty sections of a compacted log are; None if not compacted."""
        if not compacted(log_):
            return None
        config = log_.config
        if self._logs_seen.setdefault(key, log_) is not log_:  # the topic was deleted and created again
            self._logs_seen[key] = log_
            self._checkpoints.pop(key, None)
            self._horizons.pop(key, None)
        segments = log_.segments
        start = log_.log_start_offset
        checkpoint = self._checkpoints.get(key, start)
        first_dirty = checkpoint if start <= checkpoint <= log_.log_end_offset else start
        first_uncleanable = min(log_.last_stable_offset, segments[-1].base_offset)
        min_lag = config["min.compaction.lag.ms"]
        if min_lag > 0:
            for segment, following in zip(segments, segments[1:]):
                if following.base_offset > first_dirty and segment.max_timestamp_and_offset()[0] > now_ms - min_lag:
                    first_uncleanable = min(first_uncleanable, segment.base_offset)
                    break
        first_uncleanable = max(first_uncleanable, first_dirty)
        clean_bytes = dirty_bytes = 0
        oldest_dirty = None
        for segment, following in zip(segments, segments[1:]):
            if following.base_offset <= first_dirty:
                clean_bytes += segment.size
            elif segment.base_offset < first_uncleanable and first_dirty < first_uncleanable:
                if oldest_dirty is None:
                    oldest_dirty = segment.first_batch_timestamp()
                dirty_bytes += segment.size
        max_lag = config["max.compaction.lag.ms"]
        overdue = oldest_dirty is not None and oldest_dirty >= 0 and now_ms - oldest_dirty > max_lag
        horizon = self._horizons.get(key)
        must = (overdue and dirty_bytes > 0) or (horizon is not None and horizon <= now_ms)
        return DirtyStats(first_dirty, first_uncleanable, clean_bytes, dirty_bytes, must)

    def _grab(self) -> _Grabbed | None:
        """The filthiest cleanable log, marked in progress and snapshotted (Kafka's
        grabFilthiestCompactedLog)."""
        now = self._clock()
        best = None
        for key, log_ in self._manager.logs.items():
            if key in self._in_progress:
                continue
            if self._load_in_steps is not None and not log_.producer_state_ready and compacted(log_):
                self._load_in_steps(log_)  # its LSO is known once loaded, in a later round
                continue
            stats = self.dirty_stats(key, log_, now)
            if stats is None or len(log_.segments) < 2:
                continue
            ratio = stats.ratio
            if not (stats.must_clean or (stats.dirty_bytes > 0 and ratio > log_.config["min.cleanable.dirty.ratio"])):
                continue
            if best is None or ratio > best[0]:
                best = (ratio, key, log_, stats)
        if best is None:
            return None
        _, key, log_, stats = best
        grabbed = _Grabbed(key, log_, self._task(log_, stats, now), {s.base_offset: s for s in log_.segments[:-1]})
        self._in_progress.add(key)
        return grabbed

    @staticmethod
    def _task(log_: "Log", stats: DirtyStats, now_ms: int) -> CleanTask:
        segments = log_.segments
        config = log_.config
        infos = [SegmentInfo(s.base_offset, following.base_offset, s.log_path, s.size)
                 for s, following in zip(segments, segments[1:])]
        aborted: list[AbortedTxn] = [txn for s in segments for txn in s.txn_index.entries]
        return CleanTask(
            directory=log_.directory, segments=infos, first_dirty=stats.first_dirty,
            first_uncleanable=stats.first_uncleanable, aborted=aborted,
            last_batches=log_.producer_state.last_batch_offsets(), now_ms=now_ms,
            delete_retention_ms=config["delete.retention.ms"], segment_bytes=config["segment.bytes"],
            index_max_bytes=config["segment.index.bytes"], index_interval_bytes=config["index.interval.bytes"])

    def _commit(self, grabbed: _Grabbed, result: CleanResult):
        if self._manager.logs.get(grabbed.key) is not grabbed.log:
            raise CleaningAborted(f"{grabbed.key} was deleted while it was cleaned")
        leftovers = commit_swap(grabbed.log, grabbed.expected, result.groups, self._failpoints)
        self._checkpoints[grabbed.key] = result.end_offset
        if result.earliest_horizon is None:
            self._horizons.pop(grabbed.key, None)
        else:
            self._horizons[grabbed.key] = result.earliest_horizon
        live = {k: v for k, v in self._checkpoints.items() if k in self._manager.logs}
        return leftovers, live, next(self._checkpoint_versions)

    def _forget(self, keys: list[tuple[str, int]]) -> None:
        """Deleted partitions leave `cleaner-offset-checkpoint` now (Kafka's updateCheckpoints
        on deletion): a partition created again under the name and loaded by a restart must not
        count its records below the old offset as cleaned."""
        for key in keys:
            self._horizons.pop(key, None)
            self._logs_seen.pop(key, None)
        if not any([self._checkpoints.pop(key, None) is not None for key in keys]):
            return
        live = {k: v for k, v in self._checkpoints.items() if k in self._manager.logs}
        version = next(self._checkpoint_versions)
        worker = self._manager.disk_worker
        if worker is None:
            self._write_checkpoint(live, version)
        else:
            worker.submit("cleaner checkpoint", lambda: self._write_checkpoint(live, version))

    def _release(self, key: tuple[str, int]) -> None:
        self._in_progress.discard(key)

    # -- cleaner threads ---------------------------------------------------------------------

    def _check(self) -> None:
        if self._stop.is_set():
            raise CleaningAborted("the broker is stopping")

    def clean_once(self, run_on_owner: Callable[[Callable], object]) -> CleanResult | None:
        """Clean the filthiest log once; None when no log needs it. Called by each cleaner
        thread, and directly by tests with `run_on_owner=lambda f: f()` (no `start`: the pass
        then runs in the calling thread)."""
        grabbed = run_on_owner(self._grab)
        if grabbed is None:
            return None
        try:
            try:
                result = self._clean(grabbed.task)
            except BaseException:
                discard(grabbed.task.directory, [s.base for s in grabbed.task.segments])
                raise
            crash_at("cleaner.after_cleaned", self._failpoints)
            try:
                leftovers, checkpoints, version = run_on_owner(lambda: self._commit(grabbed, result))
            except BaseException:
                discard(grabbed.task.directory, [g.base for g in result.groups])
                raise
            remove_files(leftovers)
            self._write_checkpoint(checkpoints, version)
        finally:
            run_on_owner(lambda: self._release(grabbed.key))
        self.last_results[grabbed.key] = result
        mib = result.bytes_read / 2**20
        log.info("cleaned %s-%d up to offset %d: read %.1f MiB, wrote %.1f MiB, kept %d of %d records "
                 "in %.2f s (%.1f MiB/s)", *grabbed.key, result.end_offset, mib, result.bytes_written / 2**20,
                 result.records_kept, result.records_read, result.elapsed_s,
                 mib / result.elapsed_s if result.elapsed_s else 0.0,
                 extra={"partition_dir": grabbed.task.directory.name, "bytes_read": result.bytes_read,
                        "bytes_written": result.bytes_written, "elapsed_s": result.elapsed_s})
        return result

    def _clean(self, task: CleanTask) -> CleanResult:
        """The pass itself: in a worker process of its own once `start` ran, so record decoding
        never holds the event loop's interpreter lock; in the calling thread otherwise (tests).
        `stop` kills a worker mid-pass: it leaves only `.cleaned` files."""
        if not self._workers:
            return clean(task, OffsetMap(self._map_memory, self._load_factor), self._throttler, self._check)
        # Worker processes start fresh: forking a broker that runs threads and an event loop is
        # unsafe. Imported here: multiprocessing is not needed until the first pass.
        import multiprocessing

        spawn = multiprocessing.get_context("spawn")
        receiver, sender = spawn.Pipe(duplex=False)
        worker = spawn.Process(target=run_in_worker, name="kafka-log-cleaner-worker", daemon=True,
                                args=(sender, task, self._map_memory, self._load_factor,
                                      self._io_rate / self.threads))
        worker.start()
        sender.close()
        try:
            while not receiver.poll(0.2):
                self._check()
            try:
                succeeded, outcome = receiver.recv()
            except EOFError:
                raise CleaningAborted(f"the cleaner process exited with {worker.exitcode}") from None
        finally:
            if worker.is_alive():
                worker.kill()
            worker.join()
            receiver.close()
        if not succeeded:
            if isinstance(outcome, LogDirOffline):  # as if this process's own fsync had failed
                failed_elsewhere(outcome)
            raise outcome
        return outcome

    def _write_checkpoint(self, checkpoints: dict[tuple[str, int], int], version: int) -> None:
        with self._checkpoint_lock:
            if version > self._written_version:
                write_offset_checkpoint(self._checkpoint_path, checkpoints)
                self._written_version = version

    def start(self, run_on_owner: Callable[[Callable], object]) -> None:
        if not self.enabled:
            return
        for i in range(self.threads):
            worker = threading.Thread(target=self._run, args=(run_on_owner,), name=f"kafka-log-cleaner-thread-{i}",
                                      daemon=True)
            worker.start()
            self._workers.append(worker)

    def _run(self, run_on_owner) -> None:
        while not self._stop.is_set():
            try:
                cleaned = self.clean_once(run_on_owner)
            except CleaningAborted as exc:
                log.info("cleaning aborted: %s", exc)
                cleaned = None
            except RuntimeError as exc:  # the event loop closed under us: the broker is stopping
                if self._stop.is_set():
                    return
                log.exception("log cleaner pass failed: %s", exc)
                cleaned = None
            except Exception:
                log.exception("log cleaner pass failed; backing off")
                cleaned = None
            if cleaned is None:
                self._stop.wait(self._backoff_s)

    def stop(self) -> None:
        """Ask the threads to stop and wait for them; call off the owner thread, which must
        keep running meanwhile so a thread waiting on it can finish."""
        self._stop.set()
        for worker in self._workers:
            worker.join()
        self._workers.clear()
