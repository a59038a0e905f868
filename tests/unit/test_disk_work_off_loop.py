"""Slow disk work stays off the event loop (issue 11): the fsyncs of a rolled segment and of
its producer snapshot, the offset checkpoints and the removal of a deleted topic's files run
in the log layer's disk worker, so they cannot stall every client. In process: a real
broker on real files; os.fsync and shutil.rmtree are observed, not replaced."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading

import pytest

from ottla.config import BrokerConfig
from ottla.log.file_records import FileRecords
from ottla.records.legacy import LazyDownConversion, down_convert, down_converted
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.network import Connection


def _observe(monkeypatch, loop_thread: int, seen: list[str]) -> None:
    """Record what the loop's thread syncs (the file's path) or removes; then do it."""
    def wrap(real, what):
        def call(target, *args, **kwargs):
            if threading.get_ident() == loop_thread:
                seen.append(f"{what} {os.readlink(f'/proc/self/fd/{target}') if isinstance(target, int) else target}")
            return real(target, *args, **kwargs)
        return call
    monkeypatch.setattr(os, "fsync", wrap(os.fsync, "fsync"))
    monkeypatch.setattr(os, "fdatasync", wrap(os.fdatasync, "fdatasync"))
    monkeypatch.setattr(shutil, "rmtree", wrap(shutil.rmtree, "rmtree"))
    monkeypatch.setattr(os, "unlink", wrap(os.unlink, "unlink"))


def test_rolls_checkpoints_and_topic_deletion_leave_their_disk_work_to_the_worker(tmp_path, monkeypatch):
    seen: list[str] = []
    deleting: list[int] = []  # where in `seen` the deletion starts

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            broker.create_topic("t", 1, {"segment.bytes": 600})
            _observe(monkeypatch, threading.get_ident(), seen)
            for seq in range(40):  # an idempotent producer: each roll snapshots its state
                broker.replicas.append("t", 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())], producer_id=5,
                                                  producer_epoch=0, base_sequence=seq), now_ms=now_ms())
            log = broker.logs.get_log("t", 0)
            assert len(log.segments) > 10
            broker.logs.checkpoint()
            data_dir = log.directory
            deleting.append(len(seen))
            broker.delete_topic("t")
            assert not data_dir.exists()  # renamed away at once; removed by the worker
            await asyncio.to_thread(broker.logs.disk_worker.drain)
            assert not [p for p in tmp_path.iterdir() if p.name.startswith("t-0")]
            assert (tmp_path / "recovery-point-offset-checkpoint").exists()
        finally:
            monkeypatch.undo()
            broker.logs.close()
            broker.release_data_dir()

    asyncio.run(scenario())
    seen = [what.replace(str(tmp_path), "DATA") for what in seen]
    on_partition_files = [what for what in seen if ("DATA/t-0" in what or "-checkpoint" in what or "rmtree" in what)
                          and not what.startswith("unlink")]  # a roll removes old snapshots at once
    # The deletion's commit point (the topic file's removal, fsynced directory) stays synchronous.
    assert on_partition_files == [], on_partition_files[:10]
    # The partition's directory is renamed away and removed whole: no file of it is unlinked
    # on the loop (its index mappings are not msynced either), 1,000 partitions' worth of calls.
    assert [what for what in seen[deleting[0]:] if "DATA/t-0" in what] == []


def test_the_recovery_point_moves_once_a_rolls_fsync_is_done(tmp_path):
    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            broker.create_topic("t", 1, {"segment.bytes": 600})
            held = threading.Event()
            broker.logs.disk_worker.submit("holding the worker", lambda: held.wait(60))
            for _ in range(10):
                broker.replicas.append("t", 0, build_batch([Record(b"k", b"v" * 100, (), now_ms())]), now_ms=now_ms())
            log = broker.logs.get_log("t", 0)
            rolled_to = log.segments[-1].base_offset
            assert rolled_to > 0 and log.recovery_point == 0  # nothing fsynced yet
            held.set()
            await asyncio.to_thread(broker.logs.disk_worker.drain)
            assert log.recovery_point == rolled_to
        finally:
            broker.logs.close()
            broker.release_data_dir()

    asyncio.run(scenario())


def test_deleting_a_partition_whose_directory_is_already_gone_is_not_an_error(tmp_path):
    from ottla.log import Log
    from ottla.log.disk_worker import DiskWorker
    from tests.unit.test_log import batch, config

    worker = DiskWorker()
    log = Log(tmp_path / "t-0", config(), disk_worker=worker)
    log.append(batch(3), now_ms=0)
    shutil.rmtree(tmp_path / "t-0")
    log.delete()
    worker.close()
    assert list(tmp_path.iterdir()) == []


def drop_from_page_cache(fd: int) -> None:
    """Evict a synced file's pages, and see the first one gone (a read of it without waiting for the
    disk fails): the kernel may keep pages through one POSIX_FADV_DONTNEED (under writeback or
    another reader's readahead at that moment), and a cached first page would leave no cold read."""
    for _ in range(100):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        except BlockingIOError:
            return
    raise AssertionError("the segment's first page stayed in the page cache")


def draining_peer() -> tuple[socket.socket, bytearray, threading.Thread]:
    """Our end of a socket pair, and what a thread reads from the other end until EOF."""
    ours, theirs = socket.socketpair()
    received = bytearray()

    def drain():
        while chunk := theirs.recv(1 << 20):
            received.extend(chunk)
    reader = threading.Thread(target=drain)
    reader.start()
    return ours, received, reader


@pytest.mark.parametrize("old_format", [False, True])
def test_a_lagging_consumers_cold_reads_wait_for_the_disk_off_the_loop(tmp_path, monkeypatch, old_format):
    """A fetch response's records stay in the segment until the socket takes them; pages the
    page cache no longer holds (a consumer far behind) are read in a worker thread, those it
    holds on the loop. The peer gets exactly the segment's bytes either way. For Fetch v0-3
    (`old_format`) the same holds of the walk that sizes the down-conversion and of the
    conversion as the socket drains; the peer gets what converting at once makes."""
    loop_reads: list[int] = []
    worker_reads: list[int] = []
    ours, received, reader = draining_peer()

    async def turn():
        await asyncio.sleep(0)

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}))
        try:
            loop_thread = threading.get_ident()
            broker.create_topic("t", 1, {})
            for n in range(64):
                broker.replicas.append("t", 0, build_batch([Record(b"k", bytes([n]) * 32_000, (), now_ms())]),
                                       now_ms=now_ms())
            log = broker.logs.get_log("t", 0)
            log.flush()  # clean pages, which the kernel may drop
            records = log.read(0, 4 << 20, max_offset=log.log_end_offset, lazy=True).records
            assert isinstance(records, FileRecords) and len(records) > 1 << 20
            expected = records.read(0, len(records))
            if old_format:
                expected = down_convert(expected, 1)
            with open(log.segments[0].log_path, "rb") as segment:
                drop_from_page_cache(segment.fileno())
            _, connection = await asyncio.get_running_loop().connect_accepted_socket(lambda: Connection(broker), ours)
            real = os.pread

            def observed(fd, length, offset):
                (loop_reads if threading.get_ident() == loop_thread else worker_reads).append(length)
                return real(fd, length, offset)
            monkeypatch.setattr(os, "pread", observed)

            async def send():  # as the Fetch handler and the connection do
                response = await down_converted(records, 1, turn) if old_format else records
                assert isinstance(response, LazyDownConversion if old_format else FileRecords)
                await connection._send([response])
            await send()
            cold = len(worker_reads)
            await send()  # now in the page cache: read on the loop, no thread
            monkeypatch.undo()
            connection.close()
            await asyncio.sleep(0)
            return cold, expected
        finally:
            monkeypatch.undo()
            broker.logs.close()
            broker.release_data_dir()

    cold, expected = asyncio.run(scenario())
    reader.join(30)
    assert loop_reads == []
    assert cold > 0 and len(worker_reads) == cold
    assert bytes(received) == expected * 2
