"""DataSync: internal-topic appends are answered only after an fdatasync that began after them,
run in a worker thread so the event loop keeps serving meanwhile."""

import asyncio
import os
import threading

import pytest

from ottla import durability
from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.log import LogManager
from ottla.records.records import Record, build_batch
from ottla.server import data_sync
from ottla.server.data_sync import DataSync

TOPIC = "__internal"


@pytest.fixture
def logs(tmp_path):
    manager = LogManager(tmp_path, BrokerConfig())
    manager.create_topic(TOPIC, 3, {})
    yield manager
    manager.close()


def append(logs, partition, now=1_000):
    logs.get_log(TOPIC, partition).append(build_batch([Record(b"k", b"v", (), now)]), now_ms=now,
                                          origin="coordinator")


class SyncRecorder:
    """Wraps the real os.fdatasync: records the file each call synced and which thread made it,
    and can hold a call until released."""

    def __init__(self, monkeypatch):
        self.synced: list[tuple[str, int]] = []  # (path, file size when the sync began)
        self.threads: set[int] = set()
        self.hold = threading.Event()
        self.hold.set()
        self.started = threading.Event()
        real = os.fdatasync

        def fdatasync(fd):
            self.threads.add(threading.get_ident())
            self.synced.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
            self.started.set()
            self.hold.wait(10)
            real(fd)

        monkeypatch.setattr(data_sync.os, "fdatasync", fdatasync)


async def hold_a_round(sync, logs, recorder, on_synced):
    """Append to partition 0 and return once the sync covering it has begun (and is held)."""
    recorder.hold.clear()
    append(logs, 0)
    sync.after_sync(0, on_synced)
    await asyncio.get_running_loop().run_in_executor(None, recorder.started.wait, 10)


async def wait_until(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_appends_of_one_turn_share_one_sync_per_partition_off_the_loop(logs, monkeypatch):
    recorder = SyncRecorder(monkeypatch)
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        for partition in (0, 0, 1, 0, 2, 1):
            append(logs, partition)
            sync.after_sync(partition, lambda error, p=partition: answers.append((p, error)))
        assert answers == []  # nothing is answered before its sync
        await wait_until(lambda: len(answers) == 6)

    asyncio.run(scenario())
    assert sorted(answers) == sorted([(0, ErrorCode.none)] * 3 + [(1, ErrorCode.none)] * 2 + [(2, ErrorCode.none)])
    assert sorted(path.rsplit("/", 2)[-2] for path, _ in recorder.synced) == [f"{TOPIC}-0", f"{TOPIC}-1", f"{TOPIC}-2"]
    assert threading.get_ident() not in recorder.threads


def test_an_append_during_a_sync_waits_for_the_next_one(logs, monkeypatch):
    recorder = SyncRecorder(monkeypatch)
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        await hold_a_round(sync, logs, recorder, lambda error: answers.append(("first", error)))
        append(logs, 0)  # lands after the first sync began: the first sync does not cover it
        sync.after_sync(0, lambda error: answers.append(("second", error)))
        await asyncio.sleep(0.05)
        assert answers == []  # the loop keeps running while the sync is held
        recorder.hold.set()
        await wait_until(lambda: len(answers) == 2)

    asyncio.run(scenario())
    assert answers == [("first", ErrorCode.none), ("second", ErrorCode.none)]
    (_, size_at_first), (_, size_at_second) = recorder.synced
    assert size_at_second > size_at_first


def test_a_partition_does_not_wait_for_another_partitions_sync(logs, monkeypatch):
    """Partition 1's append is answered while partition 0's sync is held; partition 0's next
    append still waits for a sync that begins after it."""
    release, started = threading.Event(), threading.Event()
    real = os.fdatasync

    def fdatasync(fd):
        if f"{TOPIC}-0/" in os.readlink(f"/proc/self/fd/{fd}"):
            started.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(data_sync.os, "fdatasync", fdatasync)
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        append(logs, 0)
        sync.after_sync(0, lambda error: answers.append((0, error)))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        append(logs, 0)
        sync.after_sync(0, lambda error: answers.append(("0 again", error)))
        append(logs, 1)
        sync.after_sync(1, lambda error: answers.append((1, error)))
        await wait_until(lambda: answers == [(1, ErrorCode.none)])
        release.set()
        await wait_until(lambda: len(answers) == 3)

    asyncio.run(scenario())
    assert answers == [(1, ErrorCode.none), (0, ErrorCode.none), ("0 again", ErrorCode.none)]


def test_a_roll_during_the_sync_does_not_redirect_it(logs, monkeypatch):
    """The sync works on a duplicate descriptor: closing the rolled segment cannot make it
    sync (or fail on) whatever file reuses the number."""
    recorder = SyncRecorder(monkeypatch)
    answers = []
    partition_log = logs.get_log(TOPIC, 0)

    async def scenario():
        sync = DataSync(logs, TOPIC)
        first_segment = partition_log.active_segment.log_path
        await hold_a_round(sync, logs, recorder, answers.append)
        partition_log.roll(2_000)
        for _ in range(20):  # reuse freed descriptor numbers
            os.close(os.open(os.devnull, os.O_RDONLY))
        recorder.hold.set()
        await wait_until(lambda: answers)
        return first_segment

    first_segment = asyncio.run(scenario())
    assert answers == [ErrorCode.none]
    assert recorder.synced[0][0] == str(first_segment)


def test_an_unknown_partition_is_answered_with_its_error(logs):
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        sync.after_sync(7, answers.append)
        await wait_until(lambda: answers)

    asyncio.run(scenario())
    assert answers == [ErrorCode.unknown_topic_or_partition]


def test_a_failing_sync_is_a_storage_error(logs, monkeypatch):
    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(data_sync.os, "fdatasync", failing)
    failures = []  # in place of the broker's halt (ottla.durability), so the answer can be seen
    monkeypatch.setattr(durability, "_on_failure", lambda path, exc: failures.append((path, exc.errno)))
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        append(logs, 0)
        sync.after_sync(0, answers.append)
        await wait_until(lambda: answers)

    asyncio.run(scenario())
    assert answers == [ErrorCode.kafka_storage_error]
    assert failures == [(f"{TOPIC}-0", 5)]


def test_close_answers_what_waits_and_drops_the_round_in_flight(logs, monkeypatch):
    recorder = SyncRecorder(monkeypatch)
    answers = []

    async def scenario():
        sync = DataSync(logs, TOPIC)
        await hold_a_round(sync, logs, recorder, lambda error: answers.append(("in flight", error)))
        append(logs, 1)
        sync.after_sync(1, lambda error: answers.append(("waiting", error)))
        recorder.hold.set()  # close() syncs on this thread; let it through
        sync.close()
        assert answers == [("waiting", ErrorCode.none)]
        await asyncio.sleep(0.1)  # the round in flight finishes, unanswered

    asyncio.run(scenario())
    assert answers == [("waiting", ErrorCode.none)]
    assert len(recorder.synced) == 2
