"""Delayed fetches (`server/delayed_fetch.py`): thousands of long polls falling due together, or
woken by one append, are answered a slice per loop iteration; every one is answered, in order,
never before its max_wait and without a lost wake-up."""

import asyncio
import select
import socket
import time
from datetime import timedelta

from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

from ottla.config import BrokerConfig
from ottla.protocol.codec import decode_response
from ottla.records.records import Record, build_batch
from ottla.server.broker import Broker
from ottla.server.delayed_fetch import WAKE_SLICE, DelayedFetches
from ottla.server.network import Connection
from ottla.testing.fuzz import encode

POLLS = 5 * WAKE_SLICE
# Long enough that no wait falls due before every fetch is waiting, on a loaded machine too.
MAX_WAIT_MS = 2000


def _fetch(correlation_id: int, min_bytes: int = 1) -> bytes:
    return encode(FetchRequest(max_wait=timedelta(milliseconds=MAX_WAIT_MS), min_bytes=min_bytes, max_bytes=1 << 20,
                               topics=(FetchTopic(topic="t", partitions=(
                                   FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
                               forgotten_topics_data=()), correlation_id)


async def _long_polls(tmp_path, count: int):
    """A broker and `count` connections whose Fetch of the empty partition t-0 all wait."""
    broker = Broker(tmp_path, BrokerConfig({}))
    broker.create_topic("t", 1, {})
    loop = asyncio.get_running_loop()
    clients = []
    for i in range(count):
        ours, theirs = socket.socketpair()
        await loop.connect_accepted_socket(lambda: Connection(broker), ours)
        theirs.sendall(_fetch(i))
        theirs.setblocking(False)
        clients.append(theirs)
    for _ in range(1000):
        if len(broker.connections) == count and all(c.handling for c in broker.connections):
            break
        await asyncio.sleep(0.01)
    assert len(broker.connections) == count and all(c.handling for c in broker.connections)
    return broker, clients


async def _answers_per_iteration(clients) -> tuple[list[int], dict[int, bytes]]:
    """Until every client has its answer: how many arrived in each loop iteration, and each
    client's answer frame (by its correlation id)."""
    loop = asyncio.get_running_loop()
    poller = select.poll()
    by_fd = {client.fileno(): client for client in clients}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    buffers = {fd: b"" for fd in by_fd}
    answers: dict[int, bytes] = {}
    per_iteration: list[int] = []
    done = loop.create_future()

    def tick():  # runs once per loop iteration
        arrived = 0
        for fd, _ in poller.poll(0):
            buffers[fd] += by_fd[fd].recv(1 << 20)
            data = buffers[fd]
            if len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
                correlation_id, _ = decode_response(data[4:], 1, 11)
                assert correlation_id not in answers  # one answer per fetch
                answers[correlation_id] = data[4:]
                poller.unregister(fd)
                arrived += 1
        per_iteration.append(arrived)
        if len(answers) == len(clients):
            done.set_result(None)
        else:
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.wait_for(done, 60)
    return per_iteration, answers


def _records(frame: bytes) -> bytes:
    _, response = decode_response(frame, 1, 11)
    (topic,) = response.responses
    (partition,) = topic.partitions
    assert partition.error_code == 0
    return bytes(partition.records or b"")


def test_long_polls_falling_due_together_are_answered_a_slice_per_loop_iteration(tmp_path):
    """asyncio ran every due fetch timeout in one iteration and every handler they resumed in
    the next: 2,000 empty answers held the loop for 226-269 ms of CPU. Here the waits of
    POLLS fetches are all past due at once (the loop held past them), and every fetch is
    answered, empty, at most WAKE_SLICE in one loop iteration."""

    async def scenario():
        broker, clients = await _long_polls(tmp_path, POLLS)
        try:
            time.sleep(MAX_WAIT_MS / 1000)  # the loop held: every wait (begun by now) is past due at once
            per_iteration, answers = await _answers_per_iteration(clients)
            assert sorted(answers) == list(range(POLLS))
            assert all(_records(frame) == b"" for frame in answers.values())
            assert max(per_iteration) <= WAKE_SLICE, per_iteration
        finally:
            for client in clients:
                client.close()
            await asyncio.sleep(0.05)
            broker.logs.close()

    asyncio.run(scenario())


def test_one_append_wakes_its_long_polls_a_slice_per_loop_iteration(tmp_path):
    """An append woke every fetch waiting on its partition at once. Here every one of them is
    woken (none lost) and answered with the record, at most WAKE_SLICE in one loop iteration."""

    async def scenario():
        broker, clients = await _long_polls(tmp_path, POLLS)
        try:
            broker.replicas.append("t", 0, build_batch([Record(b"k", b"woken", (), int(time.time() * 1000))]),
                                   now_ms=int(time.time() * 1000))
            per_iteration, answers = await _answers_per_iteration(clients)
            assert sorted(answers) == list(range(POLLS))
            assert all(b"woken" in _records(frame) for frame in answers.values())
            assert max(per_iteration) <= WAKE_SLICE, per_iteration
        finally:
            for client in clients:
                client.close()
            await asyncio.sleep(0.05)
            broker.logs.close()

    asyncio.run(scenario())


def test_a_fetch_woken_below_min_bytes_is_answered_at_max_wait_with_what_is_there(tmp_path):
    """Woken by an append that leaves it short of min_bytes, a fetch waits again for the rest
    of its max_wait, then answers with the record that is there."""

    async def scenario():
        broker, (client,) = await _long_polls(tmp_path, 1)
        client.setblocking(True)
        try:
            client.sendall(_fetch(1, min_bytes=1 << 20))  # queued behind the first
            broker.replicas.append("t", 0, build_batch([Record(b"k", b"first", (), int(time.time() * 1000))]),
                                   now_ms=int(time.time() * 1000))
            started = time.monotonic()
            frames = []
            while len(frames) < 2:
                frames += (await asyncio.to_thread(_read_one, client),)
            assert [decode_response(f, 1, 11)[0] for f in frames] == [0, 1]
            assert b"first" in _records(frames[0]) and b"first" in _records(frames[1])
            # The second waited its whole max_wait: woken by nothing, short of min_bytes.
            assert time.monotonic() - started >= MAX_WAIT_MS / 1000
        finally:
            client.close()
            await asyncio.sleep(0.05)
            broker.logs.close()

    asyncio.run(scenario())


def _read_one(sock: socket.socket) -> bytes:
    size = int.from_bytes(_exactly(sock, 4), "big")
    return _exactly(sock, size)


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_due_fetches_complete_by_deadline_then_arrival_never_early_each_once():
    """The purgatory on its own: waits of three deadlines registered out of order complete in
    deadline order (arrival order within one tick), never before their timeout; one woken by
    data and also due completes once, as woken; a cancelled one leaves nothing behind."""

    async def scenario():
        loop = asyncio.get_running_loop()
        fetches = DelayedFetches(wake_slice=1)
        finished: list[tuple[str, bool, bool]] = []

        async def wait(name, keys, timeout_s):
            started = loop.time()
            woken = await fetches.wait(keys, timeout_s)
            finished.append((name, woken, loop.time() - started >= timeout_s))

        tasks = [asyncio.ensure_future(wait(name, [("t", 0)], timeout))
                 for name, timeout in (("late", 0.3), ("early-1", 0.1), ("early-2", 0.1), ("mid", 0.2))]
        both = asyncio.ensure_future(wait("both", [("t", 1), ("u", 0)], 0.2))
        gone = asyncio.ensure_future(wait("gone", [("t", 1)], 0.2))
        await asyncio.sleep(0)
        assert fetches.watching(("t", 0)) == 4 and fetches.watching(("t", 1)) == 2
        gone.cancel()
        await asyncio.sleep(0)
        assert fetches.watching(("t", 1)) == 1
        time.sleep(0.25)  # the loop held: all but "late" are due at once
        while not fetches._due:
            await asyncio.sleep(0)
        fetches.notify(("u", 0))  # "both" is woken by data before its turn
        await asyncio.gather(*tasks, both)
        assert [name for name, _, _ in finished] == ["early-1", "early-2", "mid", "both", "late"]
        assert all(in_time for _, woken, in_time in finished if not woken)
        assert [name for name, woken, _ in finished if woken] == []  # due first: completed as due
        assert fetches.watching(("t", 0)) == fetches.watching(("t", 1)) == fetches.watching(("u", 0)) == 0
        assert not fetches._ticks and not fetches._due

    asyncio.run(scenario())


def test_a_followers_fetch_woken_with_many_consumers_completes_first():
    """An acks=all produce waits for the follower's next fetch: one append to a partition that
    many consumers long-poll must not queue the follower's fetch behind all of theirs, whenever
    it started waiting; the consumers keep their order."""

    async def scenario():
        fetches = DelayedFetches(wake_slice=2)
        finished: list[str] = []

        async def wait(name, replica):
            await fetches.wait([("t", 0)], 60, replica_id=1 if replica else -1)
            finished.append(name)

        tasks = [asyncio.ensure_future(wait(f"consumer-{i}", False)) for i in range(6)]
        tasks.append(asyncio.ensure_future(wait("follower", True)))
        tasks += [asyncio.ensure_future(wait(f"consumer-{i}", False)) for i in range(6, 9)]
        await asyncio.sleep(0)
        assert fetches.watching(("t", 0)) == 10
        fetches.notify(("t", 0))
        await asyncio.gather(*tasks)
        assert finished == ["follower"] + [f"consumer-{i}" for i in range(9)]
        assert not fetches._replicas and not fetches._by_replica

    asyncio.run(scenario())
