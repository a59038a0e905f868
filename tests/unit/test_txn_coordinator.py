"""TransactionCoordinator: the KIP-98 state machine, its error answers, durability and recovery.

The coordinator is driven with in-memory fakes for the `__transaction_state` log and the
marker writer; "durable" is whatever the fake store acknowledges, so the tests can hold an
append and check that nobody is answered before it is acknowledged.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from ottla.config import BrokerConfig
from ottla.coordinator.transaction import (
    InitProducerIdResult,
    TransactionCoordinator,
    TxnState,
)
from ottla.coordinator.transaction.log_format import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    TxnLogValue,
)
from ottla.coordinator.transaction.metadata import loaded_txns
from ottla.coordinator.partitioning import partition_for
from ottla.errors import ErrorCode

E = ErrorCode
NOW = 1_700_000_000_000
TID = "orders-etl"
P = partition_for(TID, 50)
T0 = ("orders", 0)
T1 = ("orders", 1)


class FakeStore:
    """`__transaction_state` in memory. Records are in the log as soon as they are appended;
    with `hold` set the acknowledgement waits for `release()`, like a slow acks=all write."""

    def __init__(self):
        self.records: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        self.hold = False
        self.held: list = []
        self.fail_with: list[ErrorCode] = []
        self.hold_loads = False
        self.held_loads: list = []

    def append(self, partition, key, value, on_durable):
        if self.fail_with:
            on_durable(self.fail_with.pop(0))
            return
        self.records[partition].append((key, value))
        if self.hold:
            self.held.append(on_durable)
        else:
            on_durable(E.none)

    def release(self):
        held, self.held = self.held, []
        for on_durable in held:
            on_durable(E.none)

    def load(self, partition, on_loaded):
        if self.hold_loads:
            self.held_loads.append(lambda: on_loaded(loaded_txns(self.records[partition])))
        else:
            on_loaded(loaded_txns(self.records[partition]))

    def history(self, transactional_id):
        """Every value written for the id, in order (None for a tombstone)."""
        p = partition_for(transactional_id, 50)
        return [None if v is None else decode_value(v)
                for k, v in self.records[p] if decode_key(k) == transactional_id]

    def last(self, transactional_id):
        return self.history(transactional_id)[-1]


class FakeMarkers:
    """Records WriteTxnMarkers calls; completes them at once when `auto`, else on `finish()`."""

    def __init__(self):
        self.calls = []
        self.versions = []  # each call's transaction version
        self.auto = True
        self.pending = []

    def write_markers(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions, on_done,
                      transaction_version=0):
        self.calls.append((producer_id, producer_epoch, coordinator_epoch, commit, set(partitions)))
        self.versions.append(transaction_version)
        if self.auto:
            on_done(E.none)
        else:
            self.pending.append(on_done)

    def finish(self, error=E.none):
        pending, self.pending = self.pending, []
        for on_done in pending:
            on_done(error)


class Harness:
    def __init__(self, store=None, config=None, coordinator_epoch=0, load=True):
        self.store = store or FakeStore()
        self.markers = FakeMarkers()
        self.ids = itertools.count(1000)
        self.config = BrokerConfig(config or {})
        self.tc = TransactionCoordinator(self.config, self.store, self.markers, lambda: next(self.ids))
        if load:
            self.load_all(coordinator_epoch)

    def load_all(self, coordinator_epoch=0, now=NOW):
        for p in range(self.tc.num_partitions):
            self.tc.load_partition(p, coordinator_epoch, now)

    @staticmethod
    def _one(results):
        assert len(results) <= 1, "answered more than once"
        return results[0] if results else None

    def init(self, tid=TID, timeout=60_000, expected=None, now=NOW):
        out = []
        self.tc.init_producer_id(tid, timeout, expected, now, out.append)
        self._last_out = out
        return self._one(out)

    def add(self, pid, epoch, partitions=(T0,), tid=TID, now=NOW):
        out = []
        self.tc.add_partitions(tid, pid, epoch, partitions, now, out.append)
        self._last_out = out
        return self._one(out)

    def offsets(self, pid, epoch, group, tid=TID, now=NOW):
        out = []
        self.tc.add_offsets(tid, pid, epoch, group, now, out.append)
        return self._one(out)

    def end(self, pid, epoch, commit=True, tid=TID, now=NOW):
        out = []
        self.tc.end_txn(tid, pid, epoch, commit, now, out.append)
        self._last_out = out
        return self._one(out)

    def answer(self):
        """The answer to the last request, once it arrived."""
        return self._one(self._last_out)

    def describe(self, tid=TID):
        (description,) = self.tc.describe_transactions([tid])
        return description

    def ready(self, tid=TID, timeout=60_000):
        """An initialized producer: (producer id, epoch)."""
        result = self.init(tid, timeout)
        assert result.error is E.none
        return result.producer_id, result.producer_epoch


@pytest.fixture
def h():
    return Harness()


# --- InitProducerId ---------------------------------------------------------------------


def test_first_init_allocates_producer_id_at_epoch_zero_and_logs_it(h):
    assert h.init() == InitProducerIdResult(E.none, 1000, 0)
    assert h.store.last(TID) == TxnLogValue(producer_id=1000, producer_epoch=0, timeout_ms=60_000,
                                            state=TxnState.EMPTY, partitions=frozenset(),
                                            last_update_ms=NOW, start_ms=-1)
    assert [p for p, records in h.store.records.items() if records] == [P]


def test_second_init_bumps_epoch_and_keeps_producer_id(h):
    h.init()
    assert h.init(timeout=30_000) == InitProducerIdResult(E.none, 1000, 1)
    assert h.store.last(TID).timeout_ms == 30_000


def test_answer_waits_until_the_record_is_durable(h):
    h.store.hold = True
    out = []
    h.tc.init_producer_id(TID, 60_000, None, NOW, out.append)
    assert out == []
    assert h.describe().producer_epoch == -1           # decided, but not the state yet
    assert h.init() == InitProducerIdResult(E.concurrent_transactions)
    h.store.release()
    assert out == [InitProducerIdResult(E.none, 1000, 0)]
    assert h.describe().producer_epoch == 0


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_invalid_transaction_timeout(h, timeout):
    assert h.init(timeout=timeout).error is E.invalid_transaction_timeout
    assert not any(h.store.records.values())


def test_max_timeout_is_accepted_and_configurable():
    h = Harness(config={"transaction.max.timeout.ms": 5000})
    assert h.init(timeout=5000).error is E.none
    assert h.init(timeout=5001).error is E.invalid_transaction_timeout


def test_empty_transactional_id_is_invalid_request(h):
    assert h.init(tid="").error is E.invalid_request


def test_not_coordinator_for_unloaded_partition():
    h = Harness(load=False)
    assert h.init().error is E.not_coordinator
    h.tc.load_partition(P, 0, NOW)
    assert h.init().error is E.none
    h.tc.unload_partition(P)
    assert h.init().error is E.not_coordinator
    assert h.add(1000, 0) is E.not_coordinator
    assert h.end(1000, 0) is E.not_coordinator


def test_load_in_progress_until_the_store_hands_over_the_records():
    h = Harness(load=False)
    h.store.hold_loads = True
    h.tc.load_partition(P, 0, NOW)
    assert h.init().error is E.coordinator_load_in_progress
    assert h.add(1, 0) is E.coordinator_load_in_progress
    assert h.end(1, 0) is E.coordinator_load_in_progress
    assert h.describe().error is E.coordinator_load_in_progress
    assert h.tc.list_transactions(NOW).error is E.coordinator_load_in_progress
    h.store.held_loads.pop()()
    assert h.init().error is E.none


# --- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------------


def test_add_partitions_starts_the_transaction(h):
    pid, epoch = h.ready()
    assert h.add(pid, epoch, [T0, T1], now=NOW + 5) is E.none
    last = h.store.last(TID)
    assert (last.state, last.partitions, last.start_ms, last.last_update_ms) == \
        (TxnState.ONGOING, frozenset({T0, T1}), NOW + 5, NOW + 5)
    # More partitions keep the start time; known ones are answered without a write.
    assert h.add(pid, epoch, [("payments", 3)], now=NOW + 9) is E.none
    assert h.store.last(TID).start_ms == NOW + 5
    writes = len(h.store.history(TID))
    assert h.add(pid, epoch, [T1], now=NOW + 10) is E.none
    assert len(h.store.history(TID)) == writes


def test_add_partitions_errors(h):
    pid, epoch = h.ready()
    assert h.add(pid, epoch, tid="unknown-id") is E.invalid_producer_id_mapping
    assert h.add(pid + 1, epoch) is E.invalid_producer_id_mapping
    assert h.add(pid, epoch + 1) is E.producer_fenced
    assert h.add(pid, epoch - 1) is E.producer_fenced


def test_add_partitions_while_a_write_is_pending_is_concurrent(h):
    pid, epoch = h.ready()
    h.store.hold = True
    assert h.add(pid, epoch, [T0]) is None
    assert h.add(pid, epoch, [T1]) is E.concurrent_transactions
    h.store.release()
    assert h.describe().partitions == {T0}


def test_add_offsets_enlists_the_groups_offsets_partition(h):
    pid, epoch = h.ready()
    assert h.offsets(pid, epoch, "consumer-group-1") is E.none
    assert h.describe().partitions == {("__consumer_offsets", 20)}   # Java: abs(hash) % 50 == 20
    h2 = Harness(config={"offsets.topic.num.partitions": 7})
    pid, epoch = h2.ready()
    h2.offsets(pid, epoch, "a")
    assert h2.describe().partitions == {("__consumer_offsets", 6)}


# --- EndTxn ----------------------------------------------------------------------------


def test_commit_flow_and_what_other_requests_see_meanwhile(h):
    pid, epoch = h.ready()
    h.add(pid, epoch, [T0, T1])
    h.markers.auto = False
    h.store.hold = True

    assert h.end(pid, epoch, commit=True, now=NOW + 20) is None      # PrepareCommit not durable yet
    assert h.markers.calls == []                                      # no marker before the decision
    assert h.end(pid, epoch, commit=True) is E.concurrent_transactions
    h.store.release()
    assert h.store.last(TID).state is TxnState.PREPARE_COMMIT
    assert h.markers.calls == [(pid, epoch, 0, True, {T0, T1})]

    # The client was answered; the transaction is completing (AddPartitionsToTxn now waits for
    # that: test_next_transaction_waits_for_the_completion_then_starts).
    assert h.init().error is E.concurrent_transactions
    assert h.end(pid, epoch, commit=True) is E.concurrent_transactions
    assert h.end(pid, epoch, commit=False) is E.concurrent_transactions   # pending Complete
    h.store.hold = False
    h.markers.finish()
    last = h.store.last(TID)
    assert (last.state, last.partitions, last.producer_epoch) == (TxnState.COMPLETE_COMMIT, frozenset(), epoch)

    # Retries after completion: the same outcome succeeds, the other is a state error.
    assert h.end(pid, epoch, commit=True) is E.none
    assert h.end(pid, epoch, commit=False) is E.invalid_txn_state
    # The next transaction starts from CompleteCommit.
    assert h.add(pid, epoch, [T1], now=NOW + 50) is E.none
    assert (h.describe().state, h.describe().start_ms) == ("Ongoing", NOW + 50)


def test_end_txn_answer_comes_with_the_prepare_record_not_the_markers(h):
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    assert h.end(pid, epoch, commit=False) is E.none
    assert h.describe().state == "PrepareAbort"
    # While markers are out the Complete transition is pending: any EndTxn is told to retry.
    assert h.end(pid, epoch, commit=False) is E.concurrent_transactions
    assert h.end(pid, epoch, commit=True) is E.concurrent_transactions
    h.markers.finish()
    assert h.end(pid, epoch, commit=False) is E.none


def test_retry_in_prepare_state_without_pending_completion():
    # After a coordinator gives up on markers (fenced), the state stays Prepare* with nothing
    # pending: the same outcome is still "in progress", the other one a state error.
    h = Harness()
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    h.markers.finish(E.transaction_coordinator_fenced)
    assert h.describe().state == "PrepareCommit"
    assert h.end(pid, epoch, commit=True) is E.concurrent_transactions
    assert h.end(pid, epoch, commit=False) is E.invalid_txn_state
    assert h.add(pid, epoch) is E.concurrent_transactions


def test_next_transaction_waits_for_the_completion_then_starts(h):
    # A client that begins its next transaction right after EndTxn: its AddOffsetsToTxn and
    # AddPartitionsToTxn are answered once the Complete record is durable, and run after it.
    pid, epoch = h.ready()
    h.add(pid, epoch, [T0])
    h.markers.auto = False
    assert h.end(pid, epoch, commit=True) is E.none
    assert h.add(pid, epoch + 1, [T1]) is E.producer_fenced              # fencing is not held
    offsets, add = [], []
    h.tc.add_offsets(TID, pid, epoch, "g", NOW + 50, offsets.append)
    assert offsets == []
    h.store.hold = True
    h.markers.finish()
    assert offsets == []                                                 # Complete not durable yet
    assert h.store.last(TID).state is TxnState.COMPLETE_COMMIT
    h.store.release()
    assert offsets == []                                                 # now its own record
    h.tc.add_partitions(TID, pid, epoch, [T1], NOW + 60, add.append)     # (a client waits for the answer)
    assert add == [E.concurrent_transactions]
    h.store.hold = False
    h.store.release()
    assert offsets == [E.none]
    assert h.add(pid, epoch, [T1], now=NOW + 60) is E.none
    offsets_partition = ("__consumer_offsets", partition_for("g", 50))
    assert [(v.state, v.partitions) for v in h.store.history(TID)[-3:]] == [
        (TxnState.COMPLETE_COMMIT, frozenset()),
        (TxnState.ONGOING, frozenset({offsets_partition})),
        (TxnState.ONGOING, frozenset({offsets_partition, T1}))]
    assert (h.describe().state, h.describe().start_ms) == ("Ongoing", NOW + 50)


def test_requests_held_for_a_completion_that_stops_get_its_outcome():
    # Markers given up (a newer coordinator or epoch): the held request runs against Prepare.
    h = Harness()
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    assert h.add(pid, epoch, [T1]) is None
    h.markers.finish(E.transaction_coordinator_fenced)
    assert h.answer() is E.concurrent_transactions
    assert h.add(pid, epoch, [T1]) is E.concurrent_transactions         # nothing completing now

    # The Complete record's append fails: answered too, and poll retries the record.
    h = Harness()
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    assert h.add(pid, epoch, [T1]) is None
    h.store.fail_with = [E.not_enough_replicas]
    h.markers.finish()
    assert h.answer() is E.concurrent_transactions
    h.tc.poll(NOW + 1)
    assert h.store.last(TID).state is TxnState.COMPLETE_COMMIT
    assert h.add(pid, epoch, [T1]) is E.none


def test_requests_held_for_a_stuck_completion_are_answered_by_poll_or_unload(h):
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    assert h.add(pid, epoch, [T1]) is None
    h.tc.poll(NOW + 1)                                                   # markers still retrying
    assert h.answer() is E.concurrent_transactions
    assert h.add(pid, epoch, [T1]) is None                               # held again, until
    h.tc.unload_partition(P)                                             # the partition moves
    assert h.answer() is E.not_coordinator
    h.markers.finish()                                                   # the old completion ends
    assert h.answer() is E.not_coordinator                               # answered once only


def test_end_txn_errors(h):
    pid, epoch = h.ready()
    assert h.end(pid, epoch, commit=True) is E.invalid_txn_state      # Empty: nothing to end
    assert h.end(pid, epoch, commit=False) is E.invalid_txn_state
    assert h.end(pid, epoch, tid="nobody") is E.invalid_producer_id_mapping
    assert h.end(pid + 1, epoch) is E.invalid_producer_id_mapping
    assert h.end(pid, epoch + 1) is E.producer_fenced
    h.add(pid, epoch)
    assert h.end(pid, epoch - 1) is E.producer_fenced
    h.store.hold = True
    h.add(pid, epoch, [T1])
    assert h.end(pid, epoch) is E.concurrent_transactions


# --- Fencing ----------------------------------------------------------------------------


def test_second_instance_fences_the_first_and_aborts_its_transaction(h):
    pid, epoch = h.ready()
    h.add(pid, epoch, [T0, T1])
    h.markers.auto = False

    # The new instance's InitProducerId aborts the old transaction under a bumped epoch and
    # is told to retry.
    assert h.init() == InitProducerIdResult(E.concurrent_transactions)
    prepared = h.store.last(TID)
    assert (prepared.state, prepared.producer_epoch, prepared.partitions) == \
        (TxnState.PREPARE_ABORT, epoch + 1, frozenset({T0, T1}))
    assert h.markers.calls == [(pid, epoch + 1, 0, False, {T0, T1})]

    # The old instance is fenced everywhere.
    assert h.add(pid, epoch, [("x", 0)]) is E.producer_fenced
    assert h.end(pid, epoch, commit=True) is E.producer_fenced
    assert h.init() == InitProducerIdResult(E.concurrent_transactions)   # still completing

    h.markers.finish()
    assert h.store.last(TID).state is TxnState.COMPLETE_ABORT
    assert h.init() == InitProducerIdResult(E.none, pid, epoch + 2)


def test_fencing_write_failure_changes_nothing(h):
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.store.fail_with = [E.not_enough_replicas]
    assert h.init() == InitProducerIdResult(E.coordinator_not_available)
    assert (h.describe().state, h.describe().producer_epoch) == ("Ongoing", epoch)
    assert h.end(pid, epoch, commit=True) is E.none                   # the old producer may finish


# --- Epoch exhaustion and KIP-360 ------------------------------------------------------


def _seed(store, tid, **fields):
    """Put a state into the log as if an earlier coordinator had written it."""
    value = dict(producer_id=500, producer_epoch=0, timeout_ms=60_000, state=TxnState.EMPTY,
                 partitions=frozenset(), last_update_ms=NOW, start_ms=-1)
    value.update(fields)
    store.records[partition_for(tid, 50)].append((encode_key(tid), encode_value(TxnLogValue(**value))))


def test_epoch_exhaustion_rotates_the_producer_id():
    store = FakeStore()
    _seed(store, TID, producer_epoch=32765)
    h = Harness(store)
    assert h.init() == InitProducerIdResult(E.none, 500, 32766)
    # 32766 is the last epoch handed out: the next init starts a new producer id at 0.
    assert h.init() == InitProducerIdResult(E.none, 1000, 0)
    assert h.store.last(TID).producer_id == 1000


def test_fencing_at_the_last_usable_epoch_then_rotation():
    store = FakeStore()
    _seed(store, TID, producer_epoch=32766, state=TxnState.ONGOING, partitions=frozenset({T0}), start_ms=NOW)
    h = Harness(store)
    assert h.init().error is E.concurrent_transactions
    assert h.markers.calls[-1][:4] == (500, 32767, 0, False)
    assert h.store.last(TID).producer_epoch == 32767
    assert h.init() == InitProducerIdResult(E.none, 1000, 0)


def test_kip360_bump_with_current_epoch_and_retry_of_a_lost_answer(h):
    pid, epoch = h.ready()
    assert h.init(expected=(pid, epoch)) == InitProducerIdResult(E.none, pid, epoch + 1)
    # The answer got lost; the client retries with the epoch it still holds.
    assert h.init(expected=(pid, epoch)) == InitProducerIdResult(E.none, pid, epoch + 1)
    # A new instance (no expected epoch) bumps and forgets the last epoch...
    assert h.init() == InitProducerIdResult(E.none, pid, epoch + 2)
    # ...so the old holder of `epoch` is now fenced.
    assert h.init(expected=(pid, epoch)).error is E.producer_fenced
    assert h.init(expected=(pid, epoch + 1)).error is E.producer_fenced
    assert h.init(expected=(pid + 7, epoch + 2)).error is E.producer_fenced


def test_kip360_on_an_unknown_id_gets_a_fresh_producer(h):
    # E.g. the id expired while the producer was idle.
    assert h.init(expected=(42, 3)) == InitProducerIdResult(E.none, 1000, 0)


def test_kip360_retry_after_rotation_returns_the_new_producer_id():
    store = FakeStore()
    _seed(store, TID, producer_epoch=32766)
    h = Harness(store)
    assert h.init(expected=(500, 32766)) == InitProducerIdResult(E.none, 1000, 0)
    assert h.init(expected=(500, 32766)) == InitProducerIdResult(E.none, 1000, 0)
    assert h.init(expected=(500, 32765)).error is E.producer_fenced


# --- Timeouts and expiration ----------------------------------------------------------


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(h):
    pid, epoch = h.ready(timeout=1000)
    h.add(pid, epoch, [T0], now=NOW)
    h.tc.poll(NOW + 1000)
    assert h.describe().state == "Ongoing"                           # not yet past the timeout
    h.tc.poll(NOW + 1001)
    assert h.markers.calls == [(pid, epoch + 1, 0, False, {T0})]
    assert [v.state for v in h.store.history(TID)][-2:] == [TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT]
    assert h.end(pid, epoch, commit=True) is E.producer_fenced
    assert h.add(pid, epoch, [T1]) is E.producer_fenced
    assert h.init() == InitProducerIdResult(E.none, pid, epoch + 2)


def test_poll_leaves_completing_and_idle_transactions_alone(h):
    pid, epoch = h.ready(timeout=1000)
    h.add(pid, epoch, [T0], now=NOW)
    h.markers.auto = False
    h.end(pid, epoch, commit=True, now=NOW + 10)
    h.tc.poll(NOW + 10_000)
    assert len(h.markers.calls) == 1
    h.ready(tid="idle", timeout=1000)
    h.tc.poll(NOW + 20_000)
    assert h.describe("idle").state == "Empty"


def test_poll_reports_its_next_deadline():
    h = Harness(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": 10_000,
                        "transaction.remove.expired.transaction.cleanup.interval.ms": 25_000})
    assert h.tc.poll(NOW) == NOW + 10_000
    assert h.tc.poll(NOW + 20_000) == NOW + 25_000
    assert h.tc.poll(NOW + 25_000) == NOW + 35_000


def test_idle_transactional_ids_expire_with_a_tombstone():
    day = 24 * 3600 * 1000
    h = Harness(config={"transactional.id.expiration.ms": day,
                        "transaction.remove.expired.transaction.cleanup.interval.ms": 1000})
    pid, epoch = h.ready(tid="idle")
    pid2, epoch2 = h.ready(tid="busy")
    assert h.add(pid2, epoch2, [T0], tid="busy", now=NOW) is E.none
    pid3, epoch3 = h.ready(tid="done")
    assert h.add(pid3, epoch3, [T0], tid="done", now=NOW) is E.none
    assert h.end(pid3, epoch3, tid="done", now=NOW + 1) is E.none

    h.tc.poll(NOW)                       # arms the expiration timer
    h.tc.poll(NOW + day - 1)
    assert h.describe("idle").error is E.none
    h.tc.poll(NOW + day + 1000)
    assert h.store.last("idle") is None
    assert h.describe("idle").error is E.transactional_id_not_found
    assert h.store.last("done") is None                 # completed transactions expire too
    # "busy" timed out in the meantime; its abort is an update, so it is not idle yet.
    assert h.store.last("busy").state is TxnState.COMPLETE_ABORT
    # An expired id starts over with a new producer id.
    assert h.init(tid="idle") == InitProducerIdResult(E.none, 1003, 0)


def test_ongoing_transactions_never_expire():
    h = Harness(config={"transactional.id.expiration.ms": 5000,
                        "transaction.remove.expired.transaction.cleanup.interval.ms": 1000})
    h.tc.poll(NOW)
    pid, epoch = h.ready(timeout=60_000)
    h.add(pid, epoch, [T0], now=NOW)
    h.tc.poll(NOW + 50_000)
    assert h.describe().state == "Ongoing"
    assert h.end(pid, epoch, commit=True, now=NOW + 50_001) is E.none


def test_expiry_respects_updates():
    h = Harness(config={"transactional.id.expiration.ms": 5000,
                        "transaction.remove.expired.transaction.cleanup.interval.ms": 1000})
    h.tc.poll(NOW)
    h.ready(tid="x")
    h.init(tid="x", now=NOW + 4000)
    h.tc.poll(NOW + 6000)
    assert h.describe("x").error is E.none
    h.tc.poll(NOW + 9000)
    assert h.describe("x").error is E.transactional_id_not_found


# --- Durability failures -------------------------------------------------------------


@pytest.mark.parametrize("store_error,client_error", [
    (E.not_enough_replicas, E.coordinator_not_available),
    (E.request_timed_out, E.coordinator_not_available),
    (E.not_leader_or_follower, E.not_coordinator),
    (E.kafka_storage_error, E.not_coordinator),
    (E.message_too_large, E.unknown_server_error),
])
def test_failed_append_is_reported_and_changes_nothing(h, store_error, client_error):
    pid, epoch = h.ready()
    h.store.fail_with = [store_error]
    assert h.add(pid, epoch) is client_error
    assert h.describe().state == "Empty"
    assert h.add(pid, epoch) is E.none


def test_partition_lost_while_a_write_is_in_flight(h):
    pid, epoch = h.ready()
    h.store.hold = True
    assert h.add(pid, epoch) is None
    h.tc.unload_partition(P)
    h.store.release()
    assert h.answer() is E.not_coordinator


def test_failed_complete_record_is_retried_by_poll(h):
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    h.store.fail_with = [E.not_enough_replicas]
    h.markers.finish()
    assert h.describe().state == "PrepareCommit"
    h.tc.poll(NOW + 1)
    assert h.describe().state == "CompleteCommit"
    assert len(h.markers.calls) == 1                    # markers are not written again


# --- Coordinator failover -----------------------------------------------------------------


def test_crash_between_prepare_commit_and_complete_commit_rolls_forward():
    old = Harness()
    pid, epoch = old.ready()
    old.add(pid, epoch, [T0, T1])
    old.offsets(pid, epoch, "g")
    old.markers.auto = False
    assert old.end(pid, epoch, commit=True) is E.none
    assert old.store.last(TID).state is TxnState.PREPARE_COMMIT
    # The coordinator dies here: markers may or may not have been written.

    new = Harness(old.store, coordinator_epoch=1)
    partitions = {T0, T1, ("__consumer_offsets", partition_for("g", 50))}
    assert new.markers.calls == [(pid, epoch, 1, True, partitions)]
    assert new.store.last(TID).state is TxnState.COMPLETE_COMMIT
    # The client retries EndTxn against the new coordinator and learns the outcome.
    assert new.end(pid, epoch, commit=True) is E.none
    # The stale coordinator's late marker acknowledgement changes nothing.
    records = len(old.store.records[P])
    old.tc.unload_partition(P)
    old.markers.finish()
    assert len(old.store.records[P]) == records


def test_crash_after_prepare_abort_rolls_forward_an_abort():
    old = Harness()
    pid, epoch = old.ready()
    old.add(pid, epoch)
    old.markers.auto = False
    old.init()                                           # fence: PrepareAbort under epoch + 1
    new = Harness(old.store, coordinator_epoch=3)
    assert new.markers.calls == [(pid, epoch + 1, 3, False, {T0})]
    assert new.describe().state == "CompleteAbort"
    assert new.init() == InitProducerIdResult(E.none, pid, epoch + 2)


def test_loading_reproduces_the_state():
    old = Harness()
    for i in range(12):
        pid, epoch = old.ready(tid=f"t{i}", timeout=10_000 + i)
        if i % 3 >= 1:
            old.add(pid, epoch, [("t", i), ("u", 0)], now=NOW + i)
        if i % 3 == 2:
            old.end(pid, epoch, commit=i % 2 == 0, now=NOW + 100)
    old.ready(tid="t0")                                   # bumped twice
    old.tc.poll(NOW)
    ids = [f"t{i}" for i in range(12)]
    new = Harness(old.store)
    assert new.tc.describe_transactions(ids) == old.tc.describe_transactions(ids)
    assert new.tc.list_transactions(NOW) == old.tc.list_transactions(NOW)
    assert new.describe("t0").producer_epoch == 1


def test_reload_discards_answers_of_the_previous_load(h):
    pid, epoch = h.ready()
    h.store.hold = True
    h.add(pid, epoch)
    h.tc.load_partition(P, 1, NOW)                       # re-elected with a new epoch
    h.store.release()
    assert h.answer() is E.not_coordinator
    # The record did reach the log, so the reloaded state has it: the client's retry is a no-op.
    h.store.hold = False
    h.tc.load_partition(P, 2, NOW)
    assert h.add(pid, epoch) is E.none
    assert h.describe().state == "Ongoing"


# --- Admin APIs and verification ----------------------------------------------------------


def _three_states(h):
    h.ready(tid="empty")
    pid, epoch = h.ready(tid="ongoing")
    h.add(pid, epoch, [T0], tid="ongoing", now=NOW - 5000)
    pid, epoch = h.ready(tid="committed")
    h.add(pid, epoch, [T1], tid="committed", now=NOW - 100)
    h.end(pid, epoch, tid="committed")


def test_list_transactions_filters(h):
    _three_states(h)

    def ids(**filters):
        result = h.tc.list_transactions(NOW, **filters)
        assert result.error is E.none
        return sorted(t.transactional_id for t in result.transactions)

    assert ids() == ["committed", "empty", "ongoing"]
    assert ids(state_filters=["Ongoing"]) == ["ongoing"]
    assert ids(state_filters=["Ongoing", "CompleteCommit"]) == ["committed", "ongoing"]
    assert ids(producer_id_filters=[1001]) == ["ongoing"]
    assert ids(duration_filter_ms=1000) == ["empty", "ongoing"]     # Kafka: Empty has start -1
    assert ids(transactional_id_pattern="o.*") == ["ongoing"]
    assert ids(transactional_id_pattern="ngo") == []                  # full match, like Java's
    result = h.tc.list_transactions(NOW, state_filters=["Ongoing", "Bogus"])
    assert result.unknown_state_filters == ("Bogus",)
    assert [t.state for t in result.transactions] == ["Ongoing"]
    assert h.tc.list_transactions(NOW, state_filters=["Bogus"]).transactions == ()
    assert h.tc.list_transactions(NOW, transactional_id_pattern="(").error is E.invalid_regular_expression


def test_describe_transactions(h):
    _three_states(h)
    ongoing, committed, missing = h.tc.describe_transactions(["ongoing", "committed", "missing"])
    assert (ongoing.error, ongoing.state, ongoing.producer_id, ongoing.producer_epoch,
            ongoing.timeout_ms, ongoing.start_ms, ongoing.partitions) == \
        (E.none, "Ongoing", 1001, 0, 60_000, NOW - 5000, {T0})
    assert (committed.state, committed.partitions) == ("CompleteCommit", frozenset())
    assert missing.error is E.transactional_id_not_found
    h.tc.unload_partition(partition_for("ongoing", 50))
    assert h.describe("ongoing").error is E.not_coordinator


def test_verify_partitions(h):
    pid, epoch = h.ready()
    assert h.tc.verify_partitions(TID, pid, epoch, [T0]) == {T0: E.invalid_txn_state}
    h.add(pid, epoch, [T0])
    assert h.tc.verify_partitions(TID, pid, epoch, [T0, T1]) == {T0: E.none, T1: E.invalid_txn_state}
    assert h.tc.verify_partitions(TID, pid, epoch + 1, [T0]) == {T0: E.producer_fenced}
    assert h.tc.verify_partitions(TID, pid + 1, epoch, [T0]) == {T0: E.invalid_producer_id_mapping}
    h.markers.auto = False
    h.end(pid, epoch)
    assert h.tc.verify_partitions(TID, pid, epoch, [T0]) == {T0: E.concurrent_transactions}
    h.markers.finish()
    assert h.tc.verify_partitions(TID, pid, epoch, [T0]) == {T0: E.invalid_txn_state}


def test_adding_no_partitions_writes_nothing(h):
    pid, epoch = h.ready()
    writes = len(h.store.history(TID))
    assert h.add(pid, epoch, []) is E.none
    assert len(h.store.history(TID)) == writes
    assert h.describe().state == "Empty"


def test_failed_tombstone_keeps_the_id_until_the_next_pass():
    h = Harness(config={"transactional.id.expiration.ms": 1000,
                        "transaction.remove.expired.transaction.cleanup.interval.ms": 1000})
    h.tc.poll(NOW)
    h.ready()
    h.store.fail_with = [E.not_enough_replicas]
    h.tc.poll(NOW + 1000)
    assert h.describe().state == "Empty"
    h.tc.poll(NOW + 2000)
    assert h.describe().error is E.transactional_id_not_found


def test_rolled_forward_completion_is_stamped_with_the_load_time():
    old = Harness()
    pid, epoch = old.ready()
    old.add(pid, epoch)
    old.markers.auto = False
    old.end(pid, epoch, commit=False, now=NOW + 1)
    new = Harness(old.store, load=False)
    new.load_all(coordinator_epoch=1, now=NOW + 60_000)
    assert (new.store.last(TID).state, new.store.last(TID).last_update_ms) == (TxnState.COMPLETE_ABORT, NOW + 60_000)


def test_a_store_that_raises_does_not_leave_the_id_blocked(h):
    pid, epoch = h.ready()

    def broken(*args):
        raise RuntimeError("disk on fire")
    h.store.append, working = broken, h.store.append
    with pytest.raises(RuntimeError):
        h.add(pid, epoch)
    h.store.append = working
    assert h.add(pid, epoch) is E.none


def test_a_store_that_raises_on_the_complete_record_holds_no_request(h):
    # The Complete append raises instead of calling back: what waited for the completion is
    # answered by the state (CONCURRENT_TRANSACTIONS), and so is what comes after.
    pid, epoch = h.ready()
    h.add(pid, epoch)
    h.markers.auto = False
    h.end(pid, epoch, commit=True)
    assert h.add(pid, epoch, [T1]) is None

    def broken(*args):
        raise RuntimeError("disk on fire")
    h.store.append, working = broken, h.store.append
    with pytest.raises(RuntimeError):
        h.markers.finish()
    assert h.answer() is E.concurrent_transactions
    assert h.add(pid, epoch, [T1]) is E.concurrent_transactions
