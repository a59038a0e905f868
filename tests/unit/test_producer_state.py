"""ProducerStateManager: the sequence/epoch validation table, transactions, expiry, DescribeProducers."""

from __future__ import annotations

import struct

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.producer_state import (
    ActiveProducer,
    BatchMetadata,
    CompletedTxn,
    ControlBatch,
    EndTxnMarker,
    ProducerStateManager,
    read_end_txn_marker,
)
from ottla.records.batch import parse_batches, set_base_offset
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch
from tests.unit.producer_batches import NOW, data, marker

INT32_MAX = 2**31 - 1


def append(state, batches, now=NOW, origin="client"):
    return state.apply(state.validate(batches, now, origin))


def rejects(state, batches, code, origin="client"):
    before = (state.active_producers(), state.first_unstable_offset(), state.map_end_offset)
    with pytest.raises(KafkaError) as info:
        state.validate(batches, NOW, origin)
    assert info.value.code == code
    assert (state.active_producers(), state.first_unstable_offset(), state.map_end_offset) == before


@pytest.fixture
def state(tmp_path):
    return ProducerStateManager(tmp_path)


# -- sequences -----------------------------------------------------------------------------


def test_new_producer_starting_at_zero_is_accepted(state):
    plan = state.validate([data(7, 0, 0, 10, count=3)], NOW)
    assert plan.duplicate is None
    assert state.entry(7) is None  # validate alone changes nothing
    assert state.apply(plan) == []
    entry = state.entry(7)
    assert (entry.epoch, entry.last_seq, entry.last_offset) == (0, 2, 12)
    assert entry.batches == (BatchMetadata(0, 2, 10, 12, NOW),)
    assert state.map_end_offset == 13


def test_consecutive_batches_are_accepted(state):
    append(state, [data(7, 0, 0, 0, count=2)])
    append(state, [data(7, 0, 2, 2, count=5)])
    append(state, [data(7, 0, 7, 7)])
    assert state.entry(7).last_seq == 7


def test_unknown_producer_not_starting_at_zero(state):
    rejects(state, [data(7, 0, 5, 0)], ErrorCode.unknown_producer_id)


@pytest.mark.parametrize("seq", [3, 4, 1])
def test_gap_or_rewind_outside_the_window_is_out_of_order(state, seq):
    append(state, [data(7, 0, 0, 0, count=2)])  # last sequence 1
    rejects(state, [data(7, 0, seq, 2)], ErrorCode.out_of_order_sequence_number)


def test_sequence_wraps_after_int32_max(state):
    append(state, [data(7, 0, 0, 0, count=INT32_MAX)])  # sequences 0 .. INT32_MAX - 1
    assert state.entry(7).last_seq == INT32_MAX - 1
    append(state, [data(7, 0, INT32_MAX, INT32_MAX, count=3)])  # INT32_MAX, 0, 1
    assert state.entry(7).last_seq == 1
    rejects(state, [data(7, 0, INT32_MAX + 3, 2**31 + 2)], ErrorCode.out_of_order_sequence_number)
    append(state, [data(7, 0, 2, 2**31 + 2)])
    assert state.entry(7).last_seq == 2


def test_zero_follows_int32_max(state):
    append(state, [data(7, 0, 0, 0, count=INT32_MAX)])
    append(state, [data(7, 0, INT32_MAX, INT32_MAX)])
    assert state.entry(7).last_seq == INT32_MAX
    rejects(state, [data(7, 0, 1, 2**31)], ErrorCode.out_of_order_sequence_number)
    append(state, [data(7, 0, 0, 2**31)])


# -- duplicates and the window of the last five batches ------------------------------------


def test_any_of_the_last_five_batches_is_a_duplicate(state):
    for i in range(6):
        append(state, [data(7, 0, 2 * i, 100 + 2 * i, count=2)])
    end = state.map_end_offset
    for i in range(1, 6):
        plan = state.validate([data(7, 0, 2 * i, 500, count=2)], NOW)
        assert plan.duplicate == BatchMetadata(2 * i, 2 * i + 1, 100 + 2 * i, 101 + 2 * i, NOW)
        with pytest.raises(ValueError):
            state.apply(plan)
    assert state.entry(7).last_seq == 11
    assert state.map_end_offset == end


def test_sixth_oldest_batch_is_no_longer_recognised(state):
    for i in range(6):
        append(state, [data(7, 0, i, i)])
    rejects(state, [data(7, 0, 0, 6)], ErrorCode.out_of_order_sequence_number)
    assert state.validate([data(7, 0, 1, 6)], NOW).duplicate == BatchMetadata(1, 1, 1, 1, NOW)


def test_duplicate_needs_the_exact_sequence_range(state):
    append(state, [data(7, 0, 0, 0, count=3)])
    rejects(state, [data(7, 0, 0, 3, count=2)], ErrorCode.out_of_order_sequence_number)


def test_duplicate_answers_with_the_original_timestamp(state):
    append(state, [data(7, 0, 0, 0, ts=111)], now=NOW)
    assert state.validate([data(7, 0, 0, 1, ts=999)], NOW).duplicate.timestamp == 111


def test_duplicate_inside_a_multi_batch_request_makes_it_a_duplicate(state):
    append(state, [data(7, 0, 0, 0)])
    plan = state.validate([data(8, 0, 0, 1), data(7, 0, 0, 2)], NOW)
    assert plan.duplicate == BatchMetadata(0, 0, 0, 0, NOW)
    assert state.entry(8) is None


def test_max_batches_is_configurable(tmp_path):
    state = ProducerStateManager(tmp_path, max_batches=2)
    for i in range(3):
        append(state, [data(7, 0, i, i)])
    assert [b.first_seq for b in state.entry(7).batches] == [1, 2]
    rejects(state, [data(7, 0, 0, 3)], ErrorCode.out_of_order_sequence_number)


# -- epochs --------------------------------------------------------------------------------


def test_older_epoch_is_rejected(state):
    append(state, [data(7, 3, 0, 0)])
    rejects(state, [data(7, 2, 1, 1)], ErrorCode.invalid_producer_epoch)


def test_older_epoch_is_rejected_even_for_a_batch_it_wrote(state):
    append(state, [data(7, 0, 0, 0)])
    append(state, [data(7, 1, 0, 1)])
    rejects(state, [data(7, 0, 0, 2)], ErrorCode.invalid_producer_epoch)


def test_newer_epoch_starts_over_at_zero(state):
    append(state, [data(7, 0, 0, 0, count=5)])
    append(state, [data(7, 1, 0, 5)])
    entry = state.entry(7)
    assert (entry.epoch, entry.last_seq, len(entry.batches)) == (1, 0, 1)
    # the old epoch's window is gone: same sequences under the new epoch are not duplicates
    rejects(state, [data(7, 1, 0, 6, count=5)], ErrorCode.out_of_order_sequence_number)


def test_newer_epoch_not_at_zero_is_out_of_order(state):
    append(state, [data(7, 0, 0, 0, count=5)])
    rejects(state, [data(7, 1, 5, 5)], ErrorCode.out_of_order_sequence_number)


# -- several batches in one request, atomicity ---------------------------------------------


def test_batches_of_one_request_are_checked_in_order(state):
    append(state, [data(7, 0, 0, 0, count=2), data(7, 0, 2, 2, count=2), data(8, 0, 0, 4), data(7, 0, 4, 5)])
    assert state.entry(7).last_seq == 4
    assert [b.first_offset for b in state.entry(7).batches] == [0, 2, 5]
    assert state.entry(8).last_seq == 0


def test_epoch_bump_inside_one_request(state):
    append(state, [data(7, 0, 0, 0)])
    append(state, [data(7, 0, 1, 1), data(7, 1, 0, 2), data(7, 1, 1, 3)])
    assert [b.first_offset for b in state.entry(7).batches] == [2, 3]


def test_rejected_request_changes_nothing(state):
    append(state, [data(7, 0, 0, 0, count=2)])
    rejects(state, [data(7, 0, 2, 2), data(8, 0, 0, 3), data(7, 0, 4, 4)], ErrorCode.out_of_order_sequence_number)
    assert state.entry(8) is None
    # the valid prefix is still exactly next, not a duplicate of anything
    plan = state.validate([data(7, 0, 2, 2)], NOW)
    assert plan.duplicate is None


def test_batches_without_producer_id_only_move_the_end_offset(state):
    assert append(state, [data(-1, -1, -1, 0, count=4)]) == []
    assert state.active_producers() == []
    assert state.map_end_offset == 4


def test_stale_plan_is_refused(state):
    first = state.validate([data(7, 0, 0, 0)], NOW)
    second = state.validate([data(7, 0, 0, 1)], NOW)  # also "next", since first is not applied
    state.apply(first)
    with pytest.raises(RuntimeError):
        state.apply(second)
    assert state.entry(7).last_offset == 0


def test_unknown_origin_is_a_programming_error(state):
    with pytest.raises(ValueError):
        state.validate([data(7, 0, 0, 0)], NOW, origin="elsewhere")


# -- origins -------------------------------------------------------------------------------


def test_replicated_and_recovered_batches_skip_the_checks_but_are_tracked(state):
    append(state, [data(7, 2, 0, 0)])
    append(state, [data(7, 2, 10, 1)], origin="replication")  # gap
    append(state, [data(7, 1, 50, 2)], origin="recovery")  # older epoch, gap
    entry = state.entry(7)
    assert (entry.epoch, entry.last_seq, entry.last_offset) == (1, 50, 2)


def test_replayed_batches_are_not_deduplicated(state):
    append(state, [data(7, 0, 0, 0)])
    plan = state.validate([data(7, 0, 0, 1)], NOW, origin="replication")
    assert plan.duplicate is None


def test_coordinator_writes_skip_sequences_but_not_epochs(state):
    # TxnOffsetCommit: the group coordinator writes transactional batches without sequences
    append(state, [data(7, 4, -1, 0, txn=True)], origin="coordinator")
    append(state, [data(7, 4, -1, 1, txn=True)], origin="coordinator")
    assert state.first_unstable_offset() == 0
    rejects(state, [data(7, 3, -1, 2, txn=True)], ErrorCode.invalid_producer_epoch, origin="coordinator")


def test_clients_may_not_write_control_batches(state):
    rejects(state, [marker(7, 0, 0)], ErrorCode.invalid_record)


def test_control_batch_needs_its_marker(state):
    with pytest.raises(ValueError):
        state.validate([marker(7, 0, 0).header], NOW, origin="coordinator")


# -- transactions --------------------------------------------------------------------------


def test_transaction_start_continue_commit(state):
    append(state, [data(7, 0, 0, 10, count=2, txn=True)])
    assert state.first_unstable_offset() == 10
    append(state, [data(7, 0, 2, 12, txn=True)])
    assert state.first_unstable_offset() == 10
    assert state.entry(7).txn_first_offset == 10
    completed = append(state, [marker(7, 0, 13)], origin="coordinator")
    assert completed == [CompletedTxn(7, 10, 13, False)]
    assert state.first_unstable_offset() is None
    # the epoch did not change, so the sequence simply continues in the next transaction
    append(state, [data(7, 0, 3, 14, txn=True)])
    assert state.first_unstable_offset() == 14


def test_first_unstable_offset_is_the_earliest_open_transaction(state):
    append(state, [data(1, 0, 0, 0, txn=True)])
    append(state, [data(2, 0, 0, 1, txn=True)])
    append(state, [data(3, 0, 0, 2)])
    assert state.first_unstable_offset() == 0
    assert append(state, [marker(1, 0, 3, abort=True)], origin="coordinator") == [CompletedTxn(1, 0, 3, True)]
    assert state.first_unstable_offset() == 1
    append(state, [marker(2, 0, 4)], origin="coordinator")
    assert state.first_unstable_offset() is None


def test_non_transactional_write_inside_a_transaction(state):
    append(state, [data(7, 0, 0, 0, txn=True)])
    rejects(state, [data(7, 0, 1, 1)], ErrorCode.invalid_txn_state)


def test_marker_from_an_older_producer_epoch(state):
    append(state, [data(7, 5, 0, 0, txn=True)])
    rejects(state, [marker(7, 4, 1)], ErrorCode.invalid_producer_epoch, origin="coordinator")


def test_marker_from_an_older_coordinator_epoch(state):
    append(state, [marker(7, 0, 0, coordinator_epoch=3)], origin="coordinator")
    append(state, [data(7, 0, 0, 1, txn=True)])
    rejects(state, [marker(7, 0, 2, coordinator_epoch=2)], ErrorCode.transaction_coordinator_fenced, "coordinator")
    assert append(state, [marker(7, 0, 2, coordinator_epoch=4)], origin="coordinator") == [CompletedTxn(7, 1, 2, False)]
    assert state.entry(7).coordinator_epoch == 4


def test_marker_without_open_transaction_completes_nothing(state):
    assert append(state, [marker(7, 0, 0)], origin="coordinator") == []
    entry = state.entry(7)
    assert (entry.epoch, entry.txn_first_offset, entry.last_offset) == (0, None, 0)


def test_marker_with_bumped_epoch_resets_the_sequence(state):
    append(state, [data(7, 0, 0, 0, count=3, txn=True)])
    append(state, [marker(7, 1, 3, abort=True)], origin="coordinator")
    assert state.entry(7).batches == ()
    rejects(state, [data(7, 1, 3, 4, txn=True)], ErrorCode.out_of_order_sequence_number)
    rejects(state, [data(7, 0, 3, 4, txn=True)], ErrorCode.invalid_producer_epoch)
    append(state, [data(7, 1, 0, 4, txn=True)])


def test_replicated_marker_is_tracked_without_fencing(state):
    append(state, [marker(7, 0, 0, coordinator_epoch=5)], origin="coordinator")
    append(state, [data(7, 0, 0, 1, txn=True)])
    completed = append(state, [marker(7, 0, 2, coordinator_epoch=1)], origin="replication")
    assert completed == [CompletedTxn(7, 1, 2, False)]


# -- expiry --------------------------------------------------------------------------------


def test_idle_producers_expire(tmp_path):
    state = ProducerStateManager(tmp_path, expiration_ms=1000)
    append(state, [data(1, 0, 0, 0)], now=NOW)
    append(state, [data(2, 0, 0, 1)], now=NOW + 500)
    assert state.remove_expired(NOW + 999) == 0
    assert state.remove_expired(NOW + 1000) == 1
    assert [p.producer_id for p in state.active_producers()] == [2]
    rejects(state, [data(1, 0, 1, 2)], ErrorCode.unknown_producer_id)


def test_expiry_uses_the_broker_clock_not_the_batch_timestamp(tmp_path):
    state = ProducerStateManager(tmp_path, expiration_ms=1000)
    append(state, [data(1, 0, 0, 0, ts=0)], now=NOW)  # a producer replaying old CreateTime records
    assert state.remove_expired(NOW + 1) == 0


def test_producer_with_open_transaction_does_not_expire(tmp_path):
    state = ProducerStateManager(tmp_path, expiration_ms=1000)
    append(state, [data(1, 0, 0, 0, txn=True)], now=NOW)
    assert state.remove_expired(NOW + 10**9) == 0
    assert state.first_unstable_offset() == 0
    append(state, [marker(1, 0, 1)], now=NOW + 10, origin="coordinator")
    assert state.remove_expired(NOW + 1010) == 1


def test_log_start_offset_forgets_producers_whose_last_batch_is_gone(state):
    append(state, [data(1, 0, 0, 0, count=5)])  # offsets 0-4
    append(state, [data(2, 0, 0, 5)])
    append(state, [data(3, 0, 0, 6, txn=True)])
    append(state, [data(4, 0, 0, 7)])
    assert state.on_log_start_offset(7) == 2
    assert [p.producer_id for p in state.active_producers()] == [3, 4]
    assert state.first_unstable_offset() == 6


# -- DescribeProducers ---------------------------------------------------------------------


def test_active_producers(state):
    append(state, [data(9, 2, 0, 0, count=4)], now=NOW + 1)
    append(state, [marker(5, 1, 4, coordinator_epoch=3)], now=NOW + 2, origin="coordinator")
    append(state, [data(5, 1, 0, 5, txn=True)], now=NOW + 3)
    assert state.active_producers() == [
        ActiveProducer(5, 1, 0, NOW + 3, 3, 5),
        ActiveProducer(9, 2, 3, NOW + 1, -1, -1),
    ]


# -- control record parsing ----------------------------------------------------------------


def _parse_marker(buf):
    (header,) = parse_batches(buf)
    return header, read_end_txn_marker(buf, header)


@pytest.mark.parametrize("commit", [True, False])
def test_real_batches_end_to_end(state, commit):
    records = [Record(b"k", b"v", (), NOW)] * 3
    data_buf = bytearray(
        build_batch(records, producer_id=7, producer_epoch=3, base_sequence=0, is_transactional=True, now_ms=NOW)
    )
    marker_buf = bytearray(build_control_batch(7, 3, 70000, commit, NOW))
    set_base_offset(marker_buf, 0, 3)
    (data_header,) = parse_batches(data_buf)
    marker_header, parsed = _parse_marker(marker_buf)
    assert parsed == EndTxnMarker(commit=commit, coordinator_epoch=70000)

    append(state, [data_header])
    assert state.first_unstable_offset() == 0
    completed = append(state, [ControlBatch(marker_header, parsed)], origin="coordinator")
    assert completed == [CompletedTxn(7, 0, 3, not commit)]
    assert state.active_producers() == [ActiveProducer(7, 3, 2, NOW, 70000, -1)]


def test_control_record_of_another_type_is_corrupt():
    leader_change = Record(struct.pack(">hh", 0, 2), b"", (), NOW)  # a control type other than the markers
    buf = build_batch(
        [leader_change], producer_id=7, producer_epoch=0, is_transactional=True, is_control=True, now_ms=NOW
    )
    with pytest.raises(KafkaError) as info:
        _parse_marker(buf)
    assert info.value.code == ErrorCode.corrupt_message


def test_data_batch_is_not_a_marker():
    buf = build_batch([Record(b"k", b"v", (), NOW)], now_ms=NOW)
    with pytest.raises(ValueError):
        _parse_marker(buf)
