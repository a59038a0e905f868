"""TransactionCoordinator under transactions version 2 (KIP-890 part 2): partitions added for
the client by the partition leader, the epoch bumped at every EndTxn v5 (the markers carry
the bumped one), retries told apart by the epoch, aborts without any partition, running out
of epochs, fencing, and a reload from the log."""

from __future__ import annotations

import pytest

from ottla.coordinator.transaction import EndTxnResult, TxnState
from ottla.coordinator.partitioning import partition_for
from ottla.coordinator.transaction.log_format import TxnLogValue, decode_key, encode_key, encode_value
from tests.unit.test_txn_coordinator import NOW, T0, T1, TID, E, FakeStore, Harness

MAX = 32767


class TV2(Harness):
    def add2(self, pid, epoch, partitions=(T0,), tid=TID, now=NOW):
        out = []
        self.tc.add_partitions(tid, pid, epoch, partitions, now, out.append, transaction_version=2)
        return self._one(out)

    def end2(self, pid, epoch, commit=True, tid=TID, now=NOW):
        out = []
        self.tc.end_txn_v2(tid, pid, epoch, commit, now, out.append)
        self._last_out = out
        return self._one(out)

    def value_versions(self, tid=TID):
        """The TransactionLogValue version of every record written for the id."""
        return [int.from_bytes(v[:2], "big") for p in self.store.records.values() for k, v in p
                if v is not None and decode_key(k) == tid]


@pytest.fixture
def h():
    return TV2()


def _seed(store, tid, **fields):
    """An ongoing version-2 transaction in the log, as an earlier coordinator wrote it."""
    value = dict(producer_id=500, timeout_ms=60_000, state=TxnState.ONGOING, partitions=frozenset({T0}),
                 last_update_ms=NOW, start_ms=NOW, client_transaction_version=2)
    value.update(fields)
    store.records[partition_for(tid, 50)].append((encode_key(tid), encode_value(TxnLogValue(**value), 1)))


def test_commit_bumps_the_epoch_and_the_markers_carry_it(h):
    pid, epoch = h.ready()
    assert h.add2(pid, epoch, [T0, T1]) is E.none
    assert h.end2(pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)
    assert h.markers.calls == [(pid, epoch + 1, 0, True, {T0, T1})]
    assert h.markers.versions == [2]
    last = h.store.last(TID)
    assert (last.state, last.producer_id, last.producer_epoch, last.client_transaction_version) == \
        (TxnState.COMPLETE_COMMIT, pid, epoch + 1, 2)
    # Version-2 transactions are stored as TransactionLogValue v1 (the init before was v0).
    assert h.value_versions()[0] == 0 and set(h.value_versions()[1:]) == {1}


def test_the_next_transaction_runs_at_the_bumped_epoch_and_the_old_one_is_fenced(h):
    pid, epoch = h.ready()
    h.add2(pid, epoch)
    h.end2(pid, epoch)
    assert h.add2(pid, epoch, [T1]) is E.producer_fenced        # a late write of the ended one
    assert h.add2(pid, epoch + 1, [T1]) is E.none
    assert h.end2(pid, epoch + 1, commit=False) == EndTxnResult(E.none, pid, epoch + 2)
    assert h.markers.calls[-1] == (pid, epoch + 2, 0, False, {T1})


def test_a_retried_end_txn_gets_the_decided_outcome(h):
    pid, epoch = h.ready()
    h.add2(pid, epoch)
    h.markers.auto = False
    assert h.end2(pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)
    assert h.end2(pid, epoch).error is E.concurrent_transactions      # markers still going out
    assert h.end2(pid, epoch, commit=False).error is E.concurrent_transactions
    assert h.end2(pid, epoch + 1).error is E.producer_fenced          # not a retry, not a txn
    h.markers.finish()
    assert h.end2(pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)
    assert h.end2(pid, epoch, commit=False).error is E.invalid_txn_state
    assert h.end2(pid, epoch + 1).error is E.invalid_txn_state        # commit with nothing open
    assert h.end2(pid, epoch - 1).error is E.producer_fenced


def test_abort_without_any_partition_bumps_commit_is_refused(h):
    pid, epoch = h.ready()
    assert h.end2(pid, epoch).error is E.invalid_txn_state
    assert h.end2(pid, epoch, commit=False) == EndTxnResult(E.none, pid, epoch + 1)
    assert h.markers.calls == [(pid, epoch + 1, 0, False, set())]
    assert h.store.last(TID).state is TxnState.COMPLETE_ABORT
    # Again, from CompleteAbort at the current epoch: another empty abort.
    assert h.end2(pid, epoch + 1, commit=False) == EndTxnResult(E.none, pid, epoch + 2)


def test_end_txn_v2_refuses_an_unknown_id_and_a_wrong_producer(h):
    assert h.end2(1, 0).error is E.invalid_producer_id_mapping
    pid, epoch = h.ready()
    assert h.end2(pid + 1, epoch).error is E.invalid_producer_id_mapping


def test_running_out_of_epochs_moves_to_a_new_producer_id():
    store = FakeStore()
    _seed(store, TID, producer_epoch=MAX - 1)
    h = TV2(store)
    assert h.end2(500, MAX - 1) == EndTxnResult(E.none, 1000, 0)
    # The markers still go out under the old producer id, at the one epoch no client holds.
    assert h.markers.calls == [(500, MAX, 0, True, {T0})]
    last = h.store.last(TID)
    assert (last.producer_id, last.producer_epoch, last.previous_producer_id, last.next_producer_id) == \
        (1000, 0, 500, -1)
    assert h.end2(500, MAX - 1) == EndTxnResult(E.none, 1000, 0)      # the retry
    assert h.end2(500, MAX - 2).error is E.invalid_producer_id_mapping
    assert h.add2(1000, 0) is E.none
    assert h.end2(1000, 0) == EndTxnResult(E.none, 1000, 1)


def test_a_timed_out_tv2_transaction_is_fenced_with_two_bumps(h):
    pid, epoch = h.ready(timeout=1000)
    h.add2(pid, epoch, [T0], now=NOW)
    h.tc.poll(NOW + 1001)
    assert h.markers.calls == [(pid, epoch + 2, 0, False, {T0})]
    assert h.markers.versions == [2]
    # The fenced producer's EndTxn is not taken for a retry of an EndTxn that bumped once.
    assert h.end2(pid, epoch, commit=False).error is E.producer_fenced
    assert h.add2(pid, epoch + 1) is E.producer_fenced


def test_fencing_at_the_last_epochs_moves_to_a_new_producer_id_the_fenced_one_cannot_claim():
    store = FakeStore()
    _seed(store, TID, producer_epoch=MAX - 1, timeout_ms=1000)
    h = TV2(store)
    h.tc.poll(NOW + 1001)
    assert h.markers.calls == [(500, MAX, 0, False, {T0})]
    last = h.store.last(TID)
    assert (last.state, last.producer_id, last.producer_epoch, last.previous_producer_id) == \
        (TxnState.COMPLETE_ABORT, 1000, 0, -1)
    assert h.end2(500, MAX - 1, commit=False).error is E.invalid_producer_id_mapping
    assert h.init(expected=(500, MAX - 1)).error is E.producer_fenced


def test_a_version_1_transaction_keeps_its_epoch_and_markers(h):
    pid, epoch = h.ready()
    assert h.add(pid, epoch) is E.none
    assert h.end(pid, epoch) is E.none
    assert h.markers.calls == [(pid, epoch, 0, True, {T0})]
    assert h.markers.versions == [0]
    assert set(h.value_versions()) == {0}


def test_a_reloaded_coordinator_recognizes_the_retry():
    h = TV2()
    pid, epoch = h.ready()
    h.add2(pid, epoch)
    h.end2(pid, epoch)
    reloaded = TV2(h.store)
    assert reloaded.end2(pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)
    assert reloaded.add2(pid, epoch) is E.producer_fenced
    assert reloaded.add2(pid, epoch + 1) is E.none


def test_a_decision_rolled_forward_after_a_crash_keeps_the_bumped_epoch_and_version():
    h = TV2()
    pid, epoch = h.ready()
    h.add2(pid, epoch)
    h.markers.auto = False
    h.end2(pid, epoch)                    # PrepareCommit durable, markers not yet written
    reloaded = TV2(h.store)
    assert reloaded.markers.calls == [(pid, epoch + 1, 0, True, {T0})]
    assert reloaded.markers.versions == [2]
    assert reloaded.store.last(TID).state is TxnState.COMPLETE_COMMIT
