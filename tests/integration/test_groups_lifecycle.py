"""A group's members coming and going: a clean leave, and everyone (broker included) killed -9.

test_groups.py covers a member that crashes (its session must time out first) and offsets
that survive restarts of one in-process consumer; these tests add what a clean LeaveGroup
buys, and the at-least-once contract across a kill -9 of every consumer process and the
broker at once.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.integration.test_groups import _committed, _create_and_fill

SESSION_TIMEOUT_MS = 45_000


def _leaving_member(bootstrap, group, topic, events, leave, stop):
    """A consumer process that reports each assignment (stamped with the system-wide monotonic
    clock) and, when told to leave, closes: librdkafka sends LeaveGroup."""
    name = multiprocessing.current_process().name
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_TIMEOUT_MS, "partition.assignment.strategy": "range",
    })
    consumer.subscribe([topic], on_assign=lambda _, partitions: events.put(
        ("assigned", name, time.monotonic(), sorted(p.partition for p in partitions))))
    while not stop.is_set():
        if leave.is_set():
            events.put(("leaving", name, time.monotonic(), None))
            break
        consumer.consume(100, 0.1)
    consumer.close()


def test_clean_leave_rebalances_long_before_the_session_timeout(ottla_broker_factory):
    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 3000})
    topic, group = "leavers", "polite"
    admin = _create_and_fill(broker.bootstrap, topic, 6, 5)
    context = multiprocessing.get_context("spawn")
    events, stop = context.Queue(), context.Event()
    leaves = [context.Event() for _ in range(3)]
    workers = [context.Process(target=_leaving_member, args=(broker.bootstrap, group, topic, events, leave, stop),
                               name=f"member-{i}") for i, leave in enumerate(leaves)]
    for worker in workers:
        worker.start()
    assignment: dict[str, tuple[float, list[int]]] = {}
    leaving_at = None

    def drain_until(done, timeout):
        nonlocal leaving_at
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            try:
                kind, name, stamp, partitions = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "assigned":
                assignment[name] = (stamp, partitions)
            else:
                leaving_at = stamp

    def split(sizes):
        return (sorted(len(p) for _, p in assignment.values()) == sizes
                and sorted(x for _, p in assignment.values() for x in p) == list(range(6)))

    try:
        drain_until(lambda: split([2, 2, 2]), 90)
        assert split([2, 2, 2]), assignment

        leaves[2].set()
        del assignment["member-2"]
        # The two who stay must each take one of the leaver's partitions, with a third of the
        # leaver's session still to go: only its LeaveGroup can have told the coordinator.
        drain_until(lambda: leaving_at is not None and split([3, 3]), SESSION_TIMEOUT_MS / 1000 / 3)
        assert leaving_at is not None, "member-2 never started to leave"
        assert split([3, 3]), assignment
        reassigned_at = max(stamp for stamp, _ in assignment.values())
        assert reassigned_at - leaving_at < SESSION_TIMEOUT_MS / 1000 / 3
        workers[2].join(30)
        assert workers[2].exitcode == 0

        description = admin.describe_consumer_groups([group])[group].result(15)
        assert description.state.name == "STABLE" and len(description.members) == 2
        assert sorted(tp.partition for m in description.members for tp in m.assignment.topic_partitions) == \
            list(range(6))
        assert time.monotonic() - leaving_at < SESSION_TIMEOUT_MS / 1000  # all of this while it would be alive
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()


def _processor(bootstrap, group, topic, journal):
    """A consumer process that processes records in batches, committing each batch's end
    offsets synchronously after processing it. Everything goes to an append-only journal,
    written with one os.write per line so a kill -9 loses nothing already done:
    A <t> <partitions...> on assignment, P <t> <partition> <offset> <value> per processed record,
    C <t> <partition> <offset> per acknowledged commit. <t> is the system-wide monotonic clock."""
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def note(*fields):
        os.write(fd, (" ".join(str(f) for f in (fields[0], time.monotonic(), *fields[1:])) + "\n").encode())

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
    })
    consumer.subscribe([topic], on_assign=lambda _, partitions: note("A", *sorted(p.partition for p in partitions)))
    while True:
        batch = [m for m in consumer.consume(10, 0.2) if m.error() is None]
        if not batch:
            continue
        ends = {}
        for message in batch:
            note("P", message.partition(), message.offset(), message.value().decode())
            ends[message.partition()] = message.offset() + 1
        try:
            consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in ends.items()], asynchronous=False)
        except KafkaException:
            continue  # e.g. a rebalance took the partition: whoever has it now starts at the last commit
        for partition, offset in ends.items():
            note("C", partition, offset)
        time.sleep(0.05)  # slow enough for the test to crash everything mid-way


def _read_journals(paths):
    """Per journal, its lines as (kind, time, fields...) with numbers parsed."""
    journals = []
    for path in paths:
        lines = []
        for line in Path(path).read_text().split("\n")[:-1]:  # a line being written is not yet there
            kind, stamp, *rest = line.split(" ")
            if kind == "P":
                lines.append((kind, float(stamp), int(rest[0]), int(rest[1]), rest[2]))
            else:
                lines.append((kind, float(stamp), *(int(x) for x in rest)))
        journals.append(lines)
    return journals


def _processed(journals):
    return [(line[2], line[3]) for journal in journals for line in journal if line[0] == "P"]


def _acked(journals):
    """Every acknowledged commit as (time, partition, offset)."""
    return [(line[1], line[2], line[3]) for journal in journals for line in journal if line[0] == "C"]


def _start_processors(context, bootstrap, group, topic, directory, phase):
    paths = [directory / f"{phase}-{i}.journal" for i in range(3)]
    workers = [context.Process(target=_processor, args=(bootstrap, group, topic, str(path))) for path in paths]
    for worker in workers:
        worker.start()
    return workers, paths


def _wait_journals(paths, workers, done, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Processors never exit on their own; one that did has an error on its stderr.
        assert all(w.is_alive() for w in workers), [w.exitcode for w in workers]
        journals = _read_journals(p for p in paths if p.exists())
        if done(journals):
            return journals
        time.sleep(0.2)
    raise AssertionError(f"journals did not reach the expected state in {timeout}s")


def test_commits_resume_consumption_after_kill_9_of_every_consumer_and_the_broker(ottla_broker_factory, tmp_path):
    broker = ottla_broker_factory({"group.initial.rebalance.delay.ms": 1000})
    topic, group, partitions, per_partition = "ledger", "clerks", 4, 500
    _create_and_fill(broker.bootstrap, topic, partitions, per_partition)
    every_record = {(p, o) for p in range(partitions) for o in range(per_partition)}
    context = multiprocessing.get_context("spawn")
    workers, first_paths = _start_processors(context, broker.bootstrap, group, topic, tmp_path, "before")
    try:
        _wait_journals(first_paths, workers, lambda j: len(_processed(j)) >= 0.4 * len(every_record), 120)
        broker.kill()
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.join(30)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    before = _read_journals(first_paths)
    last_acked = {p: max((o for _, q, o in _acked(before) if q == p), default=0) for p in range(partitions)}
    processed_before = _processed(before)
    assert len(set(processed_before)) < len(every_record)  # the crash came mid-way

    broker.start()
    # -1001: nothing committed, so consumption starts at the beginning.
    committed = [0 if o == -1001 else o for o in _committed(broker.bootstrap, group, topic, partitions)]
    for p in range(partitions):
        # Every acknowledged commit survived; no commit got ahead of processing.
        assert last_acked[p] <= committed[p] <= 1 + max((o for q, o in processed_before if q == p), default=-1)

    workers, second_paths = _start_processors(context, broker.bootstrap, group, topic, tmp_path, "after")
    try:
        def finished(journals):
            acked = _acked(journals)
            return all(max((o for _, q, o in acked if q == p), default=0) == per_partition for p in range(partitions))

        after = _wait_journals(second_paths, workers, finished, 180)
    finally:
        for worker in workers:
            worker.kill()
            worker.join(30)
    assert _committed(broker.bootstrap, group, topic, partitions) == [per_partition] * partitions

    processed_after = _processed(after)
    assert set(processed_before) | set(processed_after) == every_record  # nothing lost, nothing invented
    assert all(line[4] == f"{line[2]}-{line[3]}" for j in before + after for line in j if line[0] == "P")
    for p in range(partitions):
        # Consumption resumed exactly at the commit that survived the crash (so at or after the
        # last acknowledged one), never before it.
        resumed = [o for q, o in processed_after if q == p]
        if committed[p] < per_partition:
            assert min(resumed) == committed[p]
        else:
            assert not resumed

    # The at-least-once window, across rebalances and the crash: a consumer that gets a
    # partition starts at the last commit acknowledged before then or later, so a record
    # processed twice always lies at or after the commit made before its second processing.
    acked = _acked(before) + _acked(after)
    for journal in before + after:
        owned_since: dict[int, float] = {}
        for line in journal:
            if line[0] == "A":
                owned_since = {p: line[1] for p in line[2:]}
            elif line[0] == "P":
                _, _, p, offset, _ = line
                assert p in owned_since, f"processed {p}-{offset} without owning the partition"
                floor = max((o for t, q, o in acked if q == p and t < owned_since[p]), default=0)
                assert offset >= floor, (p, offset, floor)
