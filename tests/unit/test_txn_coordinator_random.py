"""Random schedules against the transaction coordinator, checking what clients rely on.

Requests, slow acknowledgements, marker completions, timers and coordinator crashes are
interleaved at random (seeded, so failures replay). After every step:
  - an answer is only given once the record behind it is acknowledged by the log;
  - markers are only written for an acknowledged Prepare record with the same outcome;
  - a zombie (an instance with an older epoch) never gets a success;
  - in the log, a Prepare record is only ever followed by the matching Complete record
    (what was decided is never undone, across crashes included);
and at the end, with everything released, no transaction is left half-done.
"""

from __future__ import annotations

import itertools
import random

import pytest

from ottla.config import BrokerConfig
from ottla.coordinator.transaction import TransactionCoordinator, TxnState
from ottla.coordinator.transaction.log_format import decode_key, decode_value
from ottla.coordinator.transaction.metadata import loaded_txns
from ottla.errors import ErrorCode

E = ErrorCode
PREPARE = {TxnState.PREPARE_COMMIT: True, TxnState.PREPARE_ABORT: False}
COMPLETE = {TxnState.COMPLETE_COMMIT: True, TxnState.COMPLETE_ABORT: False}
TIDS = ["alpha", "beta", "gamma"]
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]


class Log:
    """The `__transaction_state` partitions; appends are acknowledged in order, possibly late."""

    def __init__(self, rng):
        self.rng = rng
        self.records = {}                  # partition -> [(key, value)]
        self.acked = set()                 # (partition, index) acknowledged
        self.waiting = []                  # (partition, index, callback)
        self._decoded = {}                 # (partition, index) -> (tid, value or None)

    def append(self, partition, key, value, on_durable):
        records = self.records.setdefault(partition, [])
        records.append((key, value))
        self.waiting.append((partition, len(records) - 1, on_durable))
        if self.rng.random() < 0.5:
            self.release(1)

    def release(self, count):
        for _ in range(min(count, len(self.waiting))):
            partition, index, on_durable = self.waiting.pop(0)
            self.acked.add((partition, index))
            on_durable(E.none)

    def load(self, partition, on_loaded):
        on_loaded(loaded_txns(self.records.get(partition, [])))

    def _entries(self):
        for p, records in self.records.items():
            for i, (k, v) in enumerate(records):
                if (p, i) not in self._decoded:
                    self._decoded[p, i] = (decode_key(k), None if v is None else decode_value(v))
                yield (p, i), *self._decoded[p, i]

    def acked_values(self, tid):
        return [v for at, t, v in self._entries() if t == tid and v is not None and at in self.acked]

    def history(self, tid):
        return [v for _, t, v in self._entries() if t == tid]


class Markers:
    def __init__(self, log):
        self.log = log
        self.pending = []

    def write_markers(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions, on_done,
                      transaction_version=0):
        # Only for a decision the log acknowledged, and exactly that decision.
        decided = [v for tid in TIDS for v in self.log.acked_values(tid)
                   if v.state in PREPARE and (v.producer_id, v.producer_epoch) == (producer_id, producer_epoch)]
        assert decided, "markers before the decision was durable"
        assert PREPARE[decided[-1].state] == commit and decided[-1].partitions == partitions
        self.pending.append(on_done)

    def finish(self, count):
        for _ in range(min(count, len(self.pending))):
            self.pending.pop(0)(E.none)


def check_log_never_undoes_a_decision(log):
    for tid in TIDS:
        decided = None
        for value in log.history(tid):
            if value is None:
                assert decided is None
                continue
            if value.state in PREPARE:
                assert decided in (None, PREPARE[value.state])
                decided = PREPARE[value.state]
            elif value.state in COMPLETE:
                assert decided == COMPLETE[value.state], f"{tid}: completion without a matching decision"
                decided = None
            else:
                assert decided is None, f"{tid}: {value.state} while a decision is outstanding"


def run_schedule(seed, steps=150):
    rng = random.Random(seed)
    log = Log(rng)
    markers = Markers(log)
    ids = itertools.count(1)
    config = BrokerConfig({"transaction.state.log.num.partitions": 3,
                           "transactional.id.expiration.ms": 50_000,
                           "transaction.remove.expired.transaction.cleanup.interval.ms": 10_000})
    now = 1_000_000
    coordinator_epoch = 0

    def start():
        tc = TransactionCoordinator(config, log, markers, lambda: next(ids))
        for p in range(3):
            tc.load_partition(p, coordinator_epoch, now)
        return tc

    tc = start()
    instances = []          # [tid, pid, epoch] handed out to a client, newest last per tid
    newest = {}             # tid -> (pid, epoch) of the newest instance

    for _ in range(steps):
        now += rng.choice([0, 1, 10, 500, 5000])
        action = rng.random()
        tid = rng.choice(TIDS)
        if action < 0.2:
            # A new instance, or (KIP-360) an existing one re-initializing with what it holds.
            mine = [i for i in instances if i[0] == tid]
            expected = tuple(rng.choice(mine)[1:]) if mine and rng.random() < 0.3 else None

            def on_init(result, tid=tid, expected=expected):
                if result.error is E.none:
                    got = (result.producer_id, result.producer_epoch)
                    assert got in [(v.producer_id, v.producer_epoch) for v in log.acked_values(tid)]
                    previous = newest.get(tid)
                    # Epochs only grow; a KIP-360 retry may get the newest epoch again.
                    assert (previous is None or previous[0] != got[0] or previous[1] < got[1]
                            or (expected is not None and previous == got))
                    newest[tid] = got
                    instances.append([tid, *got])
            tc.init_producer_id(tid, rng.choice([1000, 20_000]), expected, now, on_init)
        elif action < 0.55 and instances:
            tid, pid, epoch = rng.choice(instances)
            partitions = rng.sample(PARTITIONS, rng.randint(1, 2))

            def on_add(error, tid=tid, pid=pid, epoch=epoch):
                if error is E.none:
                    assert newest[tid] == (pid, epoch), "a fenced instance enlisted partitions"
                    assert any(v.state is TxnState.ONGOING and (v.producer_id, v.producer_epoch) == (pid, epoch)
                               for v in log.acked_values(tid))
            tc.add_partitions(tid, pid, epoch, partitions, now, on_add)
        elif action < 0.7 and instances:
            tid, pid, epoch = rng.choice(instances)
            commit = rng.random() < 0.6

            def on_end(error, tid=tid, pid=pid, epoch=epoch, commit=commit):
                if error is E.none:
                    assert newest[tid] == (pid, epoch), "a fenced instance ended a transaction"
                    states = {TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT} if commit else \
                        {TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT}
                    assert any(v.state in states and (v.producer_id, v.producer_epoch) == (pid, epoch)
                               for v in log.acked_values(tid)), "EndTxn answered before its decision was durable"
            tc.end_txn(tid, pid, epoch, commit, now, on_end)
        elif action < 0.8:
            log.release(rng.randint(1, 3))
        elif action < 0.9:
            markers.finish(rng.randint(1, 2))
        elif action < 0.97:
            tc.poll(now)
        else:
            # Crash: in-flight acknowledgements and marker completions are lost with it; what
            # reached the log is what the next coordinator reads, so from now on it counts.
            log.waiting.clear()
            log.acked.update((p, i) for p, records in log.records.items() for i in range(len(records)))
            markers.pending.clear()
            coordinator_epoch += 1
            tc = start()
        check_log_never_undoes_a_decision(log)

    # Quiesce: everything acknowledged, every marker written, timers run.
    for _ in range(20):
        log.release(len(log.waiting))
        markers.finish(len(markers.pending))
        tc.poll(now)
    for tid in TIDS:
        (description,) = tc.describe_transactions([tid])
        assert description.state not in ("PrepareCommit", "PrepareAbort"), f"{tid} left half-done"
    check_log_never_undoes_a_decision(log)


@pytest.mark.parametrize("seed", range(300))
def test_random_schedules(seed):
    run_schedule(seed)
