"""How long single admin requests hold a single broker's event loop once it has many topics
(issue 11: "no single request may hold the event loop for long").

    .venv/bin/python benchmarks/loop_holds.py --topics 2000 --batch 100

Creates --topics one-partition topics, then sends, one at a time: Metadata for all topics,
Metadata auto-creating --batch new topics, CreateTopics of --batch topics, DeleteTopics of
--batch topics, DescribeLogDirs of everything, ListOffsets and OffsetCommit naming every
topic's partition, OffsetFetch of all the group's offsets. Prints each request's round trip and the longest single step the broker
measured for it (its own CPU between two awaits, `server/loop_lag.py`), then the broker's
worst event-loop lag over the run (wall clock and the loop's own CPU).

    .venv/bin/python benchmarks/loop_holds.py --topics 0 --storm 5000

--storm N: on a broker of its own, N connections opened at once (non-blocking connects, no
request sent); once the broker's CPU has settled they stay open while the broker stops, so
the broker's worst event-loop lag over that run is the storm's (or the shutdown's, which
closes them). With --close they are closed all at once (a disconnect storm) once the broker
has settled, before it stops, --rounds times over on the same broker. Each new worst lag the
broker logged is named by the phase it fell in, and its RSS is read before, with the
connections open and 3 s after they closed. `--topics 0` skips the admin requests.
--long-poll N: on a broker of its own, N consumers long-poll one empty partition together
(Fetch, max_wait 500 ms) for --seconds, each polling again as its answer arrives; the worst
CPU hold is also named by phase (the broker's start, the polling, its shutdown with the
consumers connected), from the broker's timestamped notes of each new worst.

--wide N: on a broker of its own, one topic of N partitions, a record in each, then
DeleteTopics of it: its round trip and longest single step (the partitions' directories go).

--session N: in process (a broker object, the Fetch handler called as the network calls it),
the life of one consumer's fetch session (KIP-227) of N partitions of one topic (all but one
unknown): the Fetch v11 that creates it (epoch 0), an incremental one naming nothing, one
naming 3 partitions and forgetting 2, the full fetch that closes it (epoch -1 naming it), and
a follower's session of one partition evicting it (`max.incremental.fetch.session.cache.slots`
N / 1,000: the cache's partition budget is full): each one's
longest step (the loop thread's CPU, garbage collections left out as the broker leaves them
out) and how many partitions its response names. With --alive K, then K such sessions made one
after the other and left alive: a full collection's CPU (`gc.collect()`, median of 3) with
0, 1 and K of them alive (each session's partitions tracked by the collector or not). With
--by-id, Fetch v13 naming the topic by its id (KIP-516) instead of v11 by name.

--many N: on a broker of its own, one topic of one partition, then Fetch v11, ListOffsets v5,
OffsetForLeaderEpoch v3 and DeleteRecords v1 each naming N partitions of it (all but one
unknown), one at a time: each one's round trip and longest single step, while another client
sends ApiVersions one after the other (its longest round trip: how long the others wait).

    .venv/bin/python benchmarks/loop_holds.py --topics 0 --storm 5000 --close --rounds 5
    .venv/bin/python benchmarks/loop_holds.py --topics 0 --wide 1000
    .venv/bin/python benchmarks/loop_holds.py --topics 0 --many 200000
    .venv/bin/python benchmarks/loop_holds.py --topics 0 --session 200000 --alive 5
    .venv/bin/python benchmarks/loop_holds.py --topics 0 --session 200000 --alive 5 --by-id
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import select
import socket
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokerproc import progress  # noqa: E402

from ottla.protocol.build import make, nested  # noqa: E402
from ottla.protocol.schemas import request_schema  # noqa: E402
from ottla.testing import broker  # noqa: E402
from ottla.testing.fuzz import _read_frame, encode  # noqa: E402


def _roundtrip(address, request) -> float:
    with socket.create_connection(address, timeout=600) as sock:
        started = time.monotonic()
        sock.sendall(encode(request, 1))
        assert _read_frame(sock) is not None, "the broker closed the connection"
        return time.monotonic() - started


def _create(names, partitions: int = 1):
    schema = request_schema(19, 7)
    return make(schema, timeout=timedelta(seconds=60), validate_only=False, topics=tuple(
        make(nested(schema, "CreatableTopic"), name=name, num_partitions=partitions, replication_factor=1,
             assignments=(), configs=()) for name in names))


def _metadata(names):
    schema = request_schema(3, 12)
    topics = None if names is None else tuple(make(nested(schema, "MetadataRequestTopic"), topic_id=None, name=n)
                                              for n in names)
    return make(schema, topics=topics, allow_auto_topic_creation=True, include_topic_authorized_operations=False)


def _delete(names):
    return make(request_schema(20, 6), timeout=timedelta(seconds=60), topics=tuple(
        make(nested(request_schema(20, 6), "DeleteTopicState"), name=n, topic_id=None) for n in names))


def _describe_log_dirs():
    return make(request_schema(35, 4), topics=None)


def _list_offsets(count):
    schema = request_schema(2, 8)
    return make(schema, replica_id=-1, isolation_level=0, topics=tuple(
        make(nested(schema, "ListOffsetsTopic"), name=f"t{i}", partitions=(
            make(nested(schema, "ListOffsetsPartition"), partition_index=0, current_leader_epoch=-1, timestamp=-1),))
        for i in range(count)))


def _offset_commit(count):
    schema = request_schema(8, 8)
    return make(schema, group_id="holds", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                topics=tuple(make(nested(schema, "OffsetCommitRequestTopic"), name=f"t{i}", partitions=(
                    make(nested(schema, "OffsetCommitRequestPartition"), partition_index=0, committed_offset=0,
                         committed_leader_epoch=-1, committed_metadata=""),)) for i in range(count)))


def _offset_fetch_all():
    schema = request_schema(9, 8)
    return make(schema, require_stable=False, groups=(
        make(nested(schema, "OffsetFetchRequestGroup"), group_id="holds", topics=None),))


def _broker_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith("VmRSS:"))


def _settle(pid: int) -> None:
    """Until the broker's CPU has not moved for 1 s."""
    cpu, settled = _broker_cpu_s(pid), 0
    while settled < 5:
        time.sleep(0.2)
        now = _broker_cpu_s(pid)
        settled = settled + 1 if now - cpu < 0.01 else 0
        cpu = now


def _open_all(address, count: int) -> tuple[list[socket.socket], float]:
    """`count` non-blocking connects at once; returns once all are connected (in the broker's
    accept queue or already accepted)."""
    started = time.monotonic()
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        sockets.append(sock)
    poller = select.poll()
    for sock in sockets:
        poller.register(sock, select.POLLOUT)
    waiting = len(sockets)
    while waiting:
        events = poller.poll(30_000)
        assert events, "connections did not complete within 30 s"
        for fd, _ in events:
            poller.unregister(fd)
        waiting -= len(events)
    return sockets, time.monotonic() - started


def _storm(count: int, close: bool, rounds: int) -> list[tuple[str, str]]:
    """Open `count` connections at once (and with `close`, close them all at once while the
    broker runs, `rounds` times); report the broker's worst event-loop lags, garbage
    collections and RSS."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the broker inherits it too
    phases = []  # (name, local time it began) to place the broker's log lines
    rss_open, rss_closed, connected = [], [], []
    with broker(log_level="info") as handle:
        address = (handle.host, handle.port)
        rss_before = _rss_mib(handle.pid)
        for _ in range(rounds if close else 1):
            phases.append(("storm", datetime.now()))
            sockets, took = _open_all(address, count)
            connected.append(f"{took:.1f}")
            progress(f"storm: {count} connected after {took:.1f} s")
            _settle(handle.pid)
            rss_open.append(str(_rss_mib(handle.pid)))
            if close:
                progress("storm: the broker's CPU has settled; closing them all at once")
                phases.append(("close", datetime.now()))
                for sock in sockets:
                    sock.close()
                time.sleep(3)  # the heap duty trims a second after the closing calms down
                _settle(handle.pid)
                rss_closed.append(str(_rss_mib(handle.pid)))
        progress("storm: the broker's CPU has settled; stopping it")
        phases.append(("shutdown", datetime.now()))
        handle.stop()
        log = handle.read_stderr()
        for sock in sockets:
            sock.close()
    rows = [(f"storm: {count} connections opened at once, all connected (s)", ", ".join(connected)),
            ("broker RSS before (MiB)", str(rss_before)),
            ("broker RSS with them open (MiB)", ", ".join(rss_open))]
    if close:
        rows.append(("broker RSS 3 s after they closed (MiB)", ", ".join(rss_closed)))
    lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
    notes = []
    for stamp, wall, cpu in re.findall(r"^(\S+ \S+) .*event loop lag (\d+) ms \((\d+) ms of CPU\), the worst so far",
                                       log, re.MULTILINE):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        phase = [name for name, began in phases if began <= at][-1:] or ["start"]
        notes.append(f"{wall} ({cpu}) {phase[0]}")
    return rows + [("storm: worst event-loop lag over its run: wall / loop's own CPU (ms)", " / ".join(lag[-1])),
                   ("storm: new worst lags logged on the way: wall (CPU) ms, phase", ", ".join(notes) or "none"),
                   ("storm: garbage collections, longest (how many, total)", _steps(log)[1])]


def _long_poll(count: int, seconds: float) -> list[tuple[str, str]]:
    """`count` consumers long-polling an empty partition (Fetch v11, max_wait 500 ms), each
    polling again as soon as its answer arrives, for `seconds`: they start together, so their
    waits fall due together."""
    from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fetch = encode(FetchRequest(max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20, topics=(
        FetchTopic(topic="idle", partitions=(FetchPartition(partition=0, fetch_offset=0,
                                                            partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=()), 1)
    with broker(log_level="info") as handle:
        _roundtrip((handle.host, handle.port), _create(["idle"]))
        consumers: dict[int, list] = {}
        for _ in range(count):
            sock = socket.create_connection((handle.host, handle.port))
            sock.setblocking(False)
            consumers[sock.fileno()] = [sock, b""]
        _settle(handle.pid)
        polling = datetime.now()
        poller = select.poll()
        for fd, (sock, _) in consumers.items():
            poller.register(fd, select.POLLIN)
            sock.send(fetch)
        answers, deadline, cpu = 0, time.monotonic() + seconds, _broker_cpu_s(handle.pid)
        while time.monotonic() < deadline:
            for fd, _ in poller.poll(200):
                consumer = consumers[fd]
                consumer[1] += consumer[0].recv(1 << 16)
                while len(consumer[1]) >= 4 and len(consumer[1]) >= 4 + int.from_bytes(consumer[1][:4], "big"):
                    consumer[1] = consumer[1][4 + int.from_bytes(consumer[1][:4], "big"):]
                    answers += 1
                    consumer[0].send(fetch)
        cpu = _broker_cpu_s(handle.pid) - cpu
        stopping = datetime.now()
        handle.stop()
        log = handle.read_stderr()
        for sock, _ in consumers.values():
            sock.close()
    lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
    worst = {"start": "-", "polling": "-", "shutdown": "-"}  # "-": none above an earlier phase's
    for stamp, held in re.findall(r"^(\S+ \S+) .*event loop: (\d+) ms of CPU between two wake-ups", log, re.MULTILINE):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        worst["start" if at < polling else "polling" if at < stopping else "shutdown"] = held
    return [(f"long poll: {count} consumers, answers per second", f"{answers / seconds:.0f}"),
            ("long poll: broker CPU per answer (us)", f"{cpu / max(answers, 1) * 1e6:.0f}"),
            ("long poll: worst event-loop lag: wall / loop's own CPU (ms)", " / ".join(lag[-1])),
            ("long poll: worst loop CPU between two wake-ups: start / polling / shutdown (ms)",
             " / ".join(worst.values())),
            ("long poll: holds of a second or more logged", str(log.count("event loop held for"))),
            ("long poll: garbage collections, longest (how many, total)", _steps(log)[1])]


def _steps(text: str) -> tuple[dict[str, float], str]:
    found = re.findall(r"event loop: longest single steps: (.*); longest garbage collections: (.*)", text)
    steps, collections = found[-1]
    return {what: float(ms) for what, ms in re.findall(r"(\w+ v\d+) (\d+) ms", steps)}, collections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--storm", type=int, default=0, help="connections opened at once on a broker of their own")
    parser.add_argument("--wide", type=int, default=0, help="partitions of one topic deleted, on a broker of its own")
    parser.add_argument("--close", action="store_true", help="with --storm: then close them all at once")
    parser.add_argument("--rounds", type=int, default=1, help="with --close: storms one after the other")
    parser.add_argument("--long-poll", type=int, default=0, help="consumers long-polling together, on a broker of their own")
    parser.add_argument("--seconds", type=float, default=20.0, help="with --long-poll: how long they poll")
    parser.add_argument("--many", type=int, default=0, help="partitions named by one request, on a broker of its own")
    parser.add_argument("--session", type=int, default=0, help="partitions of one fetch session, in process")
    parser.add_argument("--alive", type=int, default=0, help="with --session: sessions left alive, full collections timed")
    parser.add_argument("--by-id", action="store_true", help="with --session: Fetch v13, the topic named by id")
    args = parser.parse_args()
    rows = []
    if args.topics:
        rows += _admin_requests(args)
    if args.storm:
        rows += _storm(args.storm, args.close, args.rounds)
    if args.wide:
        rows += _wide_delete(args.wide)
    if args.long_poll:
        rows += _long_poll(args.long_poll, args.seconds)
    if args.many:
        rows += _many_partitions(args.many)
    if args.session:
        rows += _session_life(args.session, args.alive, args.by_id)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _naming(count: int) -> list[tuple[str, object]]:
    """One request of each API naming partitions 0..count-1 of topic `x`."""
    fetch, offsets, epochs, delete = (request_schema(1, 11), request_schema(2, 5), request_schema(23, 3),
                                      request_schema(21, 1))
    return [
        ("Fetch v11", make(fetch, replica_id=-1, max_wait=timedelta(milliseconds=500), min_bytes=1,
                           max_bytes=50 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                           forgotten_topics_data=(), rack_id="", topics=(make(nested(fetch, "FetchTopic"), topic="x", partitions=tuple(
                               make(nested(fetch, "FetchPartition"), partition=p, current_leader_epoch=-1, fetch_offset=0,
                                    log_start_offset=-1, partition_max_bytes=1 << 20) for p in range(count))),))),
        ("ListOffsets v5", make(offsets, replica_id=-1, isolation_level=0, topics=(make(
            nested(offsets, "ListOffsetsTopic"), name="x", partitions=tuple(make(
                nested(offsets, "ListOffsetsPartition"), partition_index=p, current_leader_epoch=-1, timestamp=-1)
                for p in range(count))),))),
        ("OffsetForLeaderEpoch v3", make(epochs, replica_id=-1, topics=(make(
            nested(epochs, "OffsetForLeaderTopic"), topic="x", partitions=tuple(make(
                nested(epochs, "OffsetForLeaderPartition"), partition=p, current_leader_epoch=-1, leader_epoch=0)
                for p in range(count))),))),
        ("DeleteRecords v1", make(delete, timeout=timedelta(seconds=30), topics=(make(
            nested(delete, "DeleteRecordsTopic"), name="x", partitions=tuple(make(
                nested(delete, "DeleteRecordsPartition"), partition_index=p, offset=0) for p in range(count))),))),
    ]


def _pinging(address, pings: list, done: threading.Event) -> threading.Thread:
    """Another client, one ApiVersions after the other until `done`: each round trip in `pings`."""
    def ping():
        with socket.create_connection(address, timeout=600) as sock:
            request = encode(make(request_schema(18, 3), client_software_name="p", client_software_version="1"), 1)
            while not done.is_set():
                started = time.monotonic()
                sock.sendall(request)
                _read_frame(sock)
                pings.append(time.monotonic() - started)

    pinger = threading.Thread(target=ping)
    pinger.start()
    return pinger


def _many_partitions(count: int) -> list[tuple[str, str]]:
    rows = []
    with broker(log_level="info") as handle:
        address = (handle.host, handle.port)
        _roundtrip(address, _create(["x"]))
        for name, request in _naming(count):
            pings, done = [], threading.Event()
            pinger = _pinging(address, pings, done)
            time.sleep(0.3)
            pings.clear()
            took = _roundtrip(address, request)
            done.set()
            pinger.join()
            rows.append((f"{name} naming {count} partitions: round trip / another client's longest ApiVersions (ms)",
                         f"{took * 1000:.0f} / {max(pings) * 1000:.0f}"))
        handle.stop()
        log = handle.read_stderr()
    lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
    steps, collections = _steps(log)
    for name, _ in _naming(0):
        rows.append((f"{name}: longest single step, broker CPU (ms)", f"{steps.get(name, 0):.0f}"))
    rows.append(("worst event-loop lag over the run: wall / loop's own CPU (ms)", " / ".join(lag[-1])))
    rows.append(("longest garbage collections", collections))
    return rows


def _session_fetch(count: int, session_id: int, epoch: int, replica_id: int = -1, forget=(), topic_id=None):
    """Fetch v11 naming topic `x`, or with `topic_id` Fetch v13 naming it by id."""
    from kio.schema.fetch.v11 import request as fetch11
    from kio.schema.fetch.v13 import request as fetch13

    schema, topic = (fetch11, {"topic": "x"}) if topic_id is None else (fetch13, {"topic_id": topic_id})
    return schema.FetchRequest(
        replica_id=replica_id, max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=50 << 20,
        isolation_level=0, session_id=session_id, session_epoch=epoch, rack_id="",
        forgotten_topics_data=(schema.ForgottenTopic(**topic, partitions=tuple(forget)),) if forget else (),
        topics=(schema.FetchTopic(**topic, partitions=tuple(schema.FetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20)
            for p in range(count))),) if count else ())


def _session_life(count: int, alive: int = 0, by_id: bool = False) -> list[tuple[str, str]]:
    """The fetch session's phases (`--session`), each one's longest step in process."""
    import asyncio
    import gc
    import tempfile

    from kio.schema.fetch.v11.response import FetchResponse as FetchResponse11
    from kio.schema.fetch.v13.response import FetchResponse as FetchResponse13
    from kio.serial import entity_reader

    from ottla.config import BrokerConfig
    from ottla.fetch_sessions import PARTITIONS_PER_SLOT
    from ottla.server import loop_lag
    from ottla.server.broker import Broker
    from ottla.server.handlers import fetch

    pauses = loop_lag.GcPauses()
    gc.callbacks.append(pauses)
    rows = []
    version, FetchResponse = (13, FetchResponse13) if by_id else (11, FetchResponse11)

    async def phase(broker, name, request):
        owner = SimpleNamespace(what=name)
        timed = loop_lag.timed(fetch.handle(SimpleNamespace(broker=broker, api_version=version,
                                                            response_type=FetchResponse), request), owner)
        started = time.thread_time()
        response = await timed
        if isinstance(response, bytes):  # an answer with nothing in it, encoded once (`EncodedBody`)
            response, _ = entity_reader(FetchResponse)(response, 0)
        named = sum(len(t.partitions) for t in response.responses)
        rows.append((f"{name}: longest step / whole, loop CPU (ms); partitions answered",
                     f"{timed.longest * 1000:.0f} / {(time.thread_time() - started) * 1000:.0f}; {named}"))
        return response

    async def life(data_dir):
        broker = Broker(data_dir, BrokerConfig({"max.incremental.fetch.session.cache.slots": -(-count // PARTITIONS_PER_SLOT)}))
        try:
            broker.create_topic("x", 1, {})
            topic_id = broker.metadata.topic("x").topic_id if by_id else None

            def request(count: int, session_id: int, epoch: int, **kwargs):
                return _session_fetch(count, session_id, epoch, topic_id=topic_id, **kwargs)
            created = await phase(broker, f"create a session of {count}", request(count, 0, 0))
            session = created.session_id
            assert session, "no session created"
            await phase(broker, "incremental, naming nothing", request(0, session, 1))
            await phase(broker, "incremental, naming 3, forgetting 2", request(3, session, 2, forget=(5, 6)))
            await phase(broker, "close it (epoch -1 naming it)", request(1, session, -1))
            assert broker.fetch_sessions.get(session) is None
            session = (await phase(broker, f"create a session of {count} again", request(count, 0, 0))).session_id
            await phase(broker, "a follower's session evicts it", request(1, 0, 0, replica_id=1))
            assert broker.fetch_sessions.get(session) is None
            if alive:
                await _collections_with_sessions(broker, count, alive, rows, topic_id)
        finally:
            broker.logs.close()
            broker.release_data_dir()

    with tempfile.TemporaryDirectory(prefix="loop-holds-") as data_dir:
        asyncio.run(life(data_dir))
    gc.callbacks.remove(pauses)
    rows.append(("garbage collections meanwhile (left out of the steps above)", pauses.summary()))
    return rows


async def _collections_with_sessions(broker, count: int, alive: int, rows: list, topic_id=None) -> None:
    """A full collection's CPU (median of 3) with 0, 1 and `alive` sessions of `count` alive
    (with `topic_id`, made by Fetch v13 naming the topic by id)."""
    import gc
    import statistics

    from kio.schema.fetch.v11.response import FetchResponse as FetchResponse11
    from kio.schema.fetch.v13.response import FetchResponse as FetchResponse13

    from ottla.server.handlers import fetch

    context = SimpleNamespace(broker=broker, api_version=11 if topic_id is None else 13,
                              response_type=FetchResponse11 if topic_id is None else FetchResponse13)
    cache = broker.fetch_sessions  # room for them all
    cache.max_entries += alive
    cache.max_partitions += alive * count
    for made in range(alive + 1):
        if made in (0, 1, alive):
            gc.collect()
            took = []
            for _ in range(3):
                started = time.thread_time()
                gc.collect()
                took.append((time.thread_time() - started) * 1000)
            rows.append((f"full collection, {made} session(s) of {count} alive: CPU (ms), median of 3",
                         f"{statistics.median(took):.1f} ({len(gc.get_objects()):,} objects tracked)"))
        if made < alive:
            assert (await fetch.handle(context, _session_fetch(count, 0, 0, topic_id=topic_id))).session_id


def _wide_delete(partitions: int) -> list[tuple[str, str]]:
    from confluent_kafka import Producer

    with broker(log_level="info") as handle:
        address = (handle.host, handle.port)
        _roundtrip(address, _create(["wide"], partitions))
        producer = Producer({"bootstrap.servers": f"{handle.host}:{handle.port}", "linger.ms": 50})
        for p in range(partitions):
            producer.produce("wide", b"v" * 100, partition=p)
        assert producer.flush(120) == 0
        pings, done = [], threading.Event()
        pinger = _pinging(address, pings, done)  # how long another client waits
        time.sleep(0.5)
        pings.clear()
        deleted = _roundtrip(address, _delete(["wide"]))
        time.sleep(0.5)
        done.set()
        pinger.join()
        handle.stop()
        log = handle.read_stderr()
    lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
    steps, _ = _steps(log)
    return [(f"DeleteTopics v6, one topic of {partitions} partitions: round trip (ms)", f"{deleted * 1000:.0f}"),
            ("DeleteTopics v6: longest single step, broker CPU (ms)", f"{steps.get('DeleteTopics v6', 0):.0f}"),
            ("another client's longest ApiVersions round trip meanwhile (ms)", f"{max(pings) * 1000:.0f}"),
            ("worst event-loop lag over the run: wall / loop's own CPU (ms)", " / ".join(lag[-1]))]


def _admin_requests(args) -> list[tuple[str, str]]:
    rows = []
    with broker(log_level="info") as handle:
        address = (handle.host, handle.port)
        started = time.monotonic()
        for first in range(0, args.topics, 500):
            _roundtrip(address, _create([f"t{i}" for i in range(first, min(args.topics, first + 500))]))
        rows.append((f"create {args.topics} topics, 500 a request (s)", f"{time.monotonic() - started:.1f}"))
        cases = [("Metadata v12, all topics", _metadata(None)),
                 (f"Metadata v12 auto-creating {args.batch} topics", _metadata([f"m{i}" for i in range(args.batch)])),
                 (f"CreateTopics v7, {args.batch} topics", _create([f"c{i}" for i in range(args.batch)])),
                 (f"DeleteTopics v6, {args.batch} topics", _delete([f"c{i}" for i in range(args.batch)])),
                 ("DescribeLogDirs v4, all topics", _describe_log_dirs()),
                 ("ListOffsets v8, every topic's partition", _list_offsets(args.topics)),
                 ("OffsetCommit v8, every topic's partition", _offset_commit(args.topics)),
                 ("OffsetFetch v8, every offset of the group", _offset_fetch_all())]
        for name, request in cases:
            rows.append((f"{name}: round trip (ms)", f"{_roundtrip(address, request) * 1000:.0f}"))
        handle.stop()
        log = handle.read_stderr()
        lag = re.findall(r"worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms", log)
    steps, collections = _steps(log)
    for api in ("Metadata v12", "CreateTopics v7", "DeleteTopics v6", "DescribeLogDirs v4", "ListOffsets v8",
                "OffsetCommit v8", "OffsetFetch v8"):
        rows.append((f"{api}: longest single step, broker CPU (ms)", f"{steps.get(api, 0):.0f}"))
    rows.append(("worst event-loop lag over the run: wall / loop's own CPU (ms)", " / ".join(lag[-1])))
    rows.append(("longest garbage collections", collections))
    return rows


if __name__ == "__main__":
    sys.exit(main())
