"""Durable acknowledgements for the coordinators' internal topics, with the fsync off the loop.

An offset commit or a transaction state change is answered once its batch is fdatasynced. The
sync runs in a worker thread: on a disk busy with the page-cache writeback of data topics one
fdatasync can take tens of milliseconds, and on the event loop that stalled every produce and
fetch of every client behind it. Appends that arrive while their partition's sync is running are
batched into its next one (a group commit), so a burst of commits costs two syncs per partition,
not one per commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from ..durability import fdatasync
from ..errors import ErrorCode, KafkaError
from ..log.manager import LogManager

log = logging.getLogger("ottla.sync")

OnSynced = Callable[[ErrorCode], None]


def _fdatasync_all(fds: dict[object, list[int]], name: Callable[[object], str]) -> dict:
    """fdatasync and close each partition's duplicated descriptors; runs in a worker thread.
    A failure takes the log directory offline (ottla.durability: by default the broker halts)."""
    errors = {}
    for partition, partition_fds in fds.items():
        try:
            for fd in partition_fds:
                fdatasync(fd, name(partition))
        except OSError as exc:
            log.error("fdatasync of partition %s failed: %s", partition, exc)
            errors[partition] = ErrorCode.kafka_storage_error
        finally:
            for fd in partition_fds:
                os.close(fd)
    return errors


def _pair_name(key: tuple[str, int]) -> str:
    return f"{key[0]}-{key[1]}"


async def sync_partitions(logs: LogManager, partitions) -> dict[tuple[str, int], ErrorCode]:
    """Make what `partitions` ((topic, partition) pairs) hold now durable, off the event loop;
    returns the errors of those that could not be synced.

    For writes whose durability something else depends on: a transaction marker must be on
    disk before the coordinator records the transaction complete, or a power loss leaves it
    complete at the coordinator and open on the partition, its LSO stuck.
    """
    fds, errors = {}, {}
    for key in partitions:
        try:
            duplicates = logs.get_log(*key).duplicate_data_fds()
        except KafkaError as exc:
            errors[key] = exc.code
        except OSError:
            log.exception("cannot sync %s-%d", *key)
            errors[key] = ErrorCode.kafka_storage_error
        else:
            if duplicates:
                fds[key] = duplicates
    if fds:
        # One worker per partition: their fdatasyncs overlap (the journal commits one of them
        # needs serve the others), where one after the other each waited for its own.
        loop = asyncio.get_running_loop()
        for done in await asyncio.gather(*(loop.run_in_executor(None, _fdatasync_all, {key: key_fds}, _pair_name)
                                           for key, key_fds in fds.items())):
            errors |= done
    return errors


class DataSync:
    """Runs `on_synced(error)` for an append once an fdatasync that began after it is done.

    A partition has one round of syncs in flight at a time, and the appends that arrive
    meanwhile wait for its next; partitions do not wait for each other's rounds (an append
    that waited for another partition's sync paid for a durability it did not need: a
    transaction's next state change behind another id's Complete record). A round works on
    duplicates of the active segments' descriptors, so a segment that rolls (and is closed) meanwhile cannot turn
    the number into another file's. A segment rolled whose own fsync is still queued in
    the disk worker is synced by the round too (Log.duplicate_data_fds).
    """

    def __init__(self, logs: LogManager, topic: str):
        self._logs = logs
        self._topic = topic
        self._waiting: dict[int, list[OnSynced]] = {}
        self._running: set[int] = set()  # partitions with a round in flight
        self._round_scheduled = False
        self._closed = False

    def _name(self, partition: int) -> str:
        return f"{self._topic}-{partition}"

    def after_sync(self, partition: int, on_synced: OnSynced) -> None:
        """Call `on_synced` (on the event loop) once what `partition` holds now is durable."""
        self._waiting.setdefault(partition, []).append(on_synced)
        if partition not in self._running and not self._round_scheduled:
            self._round_scheduled = True
            # call_soon: every append of this turn of the loop joins the same round.
            asyncio.get_running_loop().call_soon(self._start_round)

    def _duplicate_fds(self, partitions) -> tuple[dict[int, list[int]], dict[int, ErrorCode]]:
        fds, errors = {}, {}
        for partition in partitions:
            try:
                duplicates = self._logs.get_log(self._topic, partition).duplicate_data_fds()
            except KafkaError as exc:
                errors[partition] = exc.code
            except OSError:
                log.exception("cannot sync %s-%d", self._topic, partition)
                errors[partition] = ErrorCode.kafka_storage_error
            else:
                if duplicates:
                    fds[partition] = duplicates
        return fds, errors

    def _start_round(self) -> None:
        """A round for the partitions that wait and have none in flight."""
        self._round_scheduled = False
        if self._closed:
            return
        waiting = {partition: self._waiting.pop(partition) for partition in list(self._waiting)
                   if partition not in self._running}
        if not waiting:
            return
        self._running.update(waiting)
        fds, errors = self._duplicate_fds(waiting)
        future = asyncio.get_running_loop().run_in_executor(None, _fdatasync_all, fds, self._name)
        future.add_done_callback(lambda done: self._finish_round(waiting, errors, done))

    def _finish_round(self, waiting: dict[int, list[OnSynced]], errors: dict[int, ErrorCode],
                      done: asyncio.Future) -> None:
        if self._closed:
            return  # the broker stopped; the next start reads the log
        if done.exception() is not None:
            log.error("sync round of %s failed: %s", self._topic, done.exception())
            errors = dict.fromkeys(waiting, ErrorCode.kafka_storage_error)
        else:
            errors = errors | done.result()
        self._running.difference_update(waiting)
        _answer(waiting, errors)
        self._start_round()

    def close(self) -> None:
        """Sync and answer what waits for the next round, here and now; a round in flight is
        not answered (its clients are disconnected and retry against the restarted broker)."""
        waiting, self._waiting = self._waiting, {}
        self._closed = True
        fds, errors = self._duplicate_fds(waiting)
        _answer(waiting, errors | _fdatasync_all(fds, self._name))


def _answer(waiting: dict[int, list[OnSynced]], errors: dict[int, ErrorCode]) -> None:
    for partition, callbacks in waiting.items():
        error = errors.get(partition, ErrorCode.none)
        for on_synced in callbacks:
            on_synced(error)
