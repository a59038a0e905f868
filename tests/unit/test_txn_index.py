"""The `.txnindex` aborted-transaction index: file format, search, truncation, torn entries."""

from __future__ import annotations

import struct

import pytest

from ottla.log.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    CorruptIndexError,
    TransactionIndex,
    aborted_entries,
    index_path,
)
from ottla.producer_state import CompletedTxn

BASE = 100


@pytest.fixture
def path(tmp_path):
    return index_path(tmp_path, BASE)


def entries():
    # producer, first offset, last offset (the ABORT marker), LSO after the abort
    return [
        AbortedTxn(1, 100, 110, 111),
        AbortedTxn(2, 105, 130, 131),
        AbortedTxn(3, 120, 140, 125),   # another transaction (first offset 125) still open
        AbortedTxn(4, 125, 160, 161),
    ]


def filled(path):
    index = TransactionIndex(path, BASE)
    for txn in entries():
        index.append(txn)
    return index


def test_file_name_and_entry_layout(path):
    assert path.name == "00000000000000000100.txnindex"
    index = TransactionIndex(path, BASE)
    assert not path.exists()                       # created by the first entry only
    index.append(AbortedTxn(7, 100, 105, 106))
    assert path.read_bytes() == struct.pack(">hqqqq", 0, 7, 100, 105, 106)
    assert ENTRY_SIZE == 34


def test_reopen_reads_the_entries_back(path):
    filled(path).close()
    assert TransactionIndex(path, BASE).entries == entries()
    assert TransactionIndex(path, BASE).last_offset == 160


def test_entries_must_be_appended_in_marker_order(path):
    index = filled(path)
    with pytest.raises(ValueError):
        index.append(AbortedTxn(9, 150, 160, 161))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(9, 150, 159, 161))


@pytest.mark.parametrize("fetch,upper,expected_producers,complete", [
    (100, 105, [1], True),        # entry 1's LSO (111) is past the bound: nothing later overlaps
    (111, 120, [2], True),
    (100, 200, [1, 2, 3, 4], False),
    (131, 141, [3, 4], True),     # entry 3's LSO (125) is below the bound; entry 4's is not
    (161, 170, [], False),
    (0, 100, [], True),           # entry 1 starts at 100: not inside [0, 100)
])
def test_collect_aborted(path, fetch, upper, expected_producers, complete):
    result = filled(path).collect_aborted(fetch, upper)
    assert [t.producer_id for t in result.aborted] == expected_producers
    assert result.complete is complete


def test_collect_stops_at_the_first_entry_whose_lso_reaches_the_bound(path):
    index = TransactionIndex(path, BASE)
    index.append(AbortedTxn(1, 100, 101, 500))     # the LSO jumped past everything later
    index.append(AbortedTxn(2, 200, 300, 301))
    result = index.collect_aborted(100, 400)
    assert [t.producer_id for t in result.aborted] == [1]
    assert result.complete


def test_truncate_to(path):
    index = filled(path)
    index.truncate_to(140)                          # drops the entries whose marker is at >= 140
    assert [t.producer_id for t in index.entries] == [1, 2]
    assert path.stat().st_size == 2 * ENTRY_SIZE
    index.append(AbortedTxn(5, 135, 139, 140))     # appends continue after the cut
    index.close()
    assert [t.producer_id for t in TransactionIndex(path, BASE).entries] == [1, 2, 5]


def test_truncate_past_the_end_keeps_everything_and_to_start_empties(path):
    index = filled(path)
    index.truncate_to(1000)
    assert len(index.entries) == 4
    index.truncate_to(BASE)
    assert index.entries == [] and path.stat().st_size == 0


def test_torn_last_entry(path):
    filled(path).close()
    with open(path, "ab") as f:
        f.write(struct.pack(">hqq", 0, 9, 170)[:15])   # a crash in the middle of an append
    index = TransactionIndex(path, BASE)
    assert index.entries == entries()
    with pytest.raises(CorruptIndexError):
        index.sanity_check()
    with pytest.raises(CorruptIndexError):
        index.append(AbortedTxn(9, 165, 170, 171))
    assert index.drop_torn_entry() is True
    assert index.drop_torn_entry() is False
    assert path.stat().st_size == 4 * ENTRY_SIZE
    index.sanity_check()
    index.append(AbortedTxn(9, 165, 170, 171))          # log recovery writes it again
    index.close()
    assert TransactionIndex(path, BASE).entries[-1] == AbortedTxn(9, 165, 170, 171)


def test_sanity_check_rejects_entries_before_the_segment(path):
    index = TransactionIndex(path, 200)
    index.append(AbortedTxn(1, 150, 199, 200))
    with pytest.raises(CorruptIndexError):
        index.sanity_check()


def test_unknown_entry_version_is_corruption(path):
    path.write_bytes(struct.pack(">hqqqq", 1, 1, 100, 101, 102))
    with pytest.raises(CorruptIndexError):
        TransactionIndex(path, BASE)


def test_reset_rename_delete(path, tmp_path):
    index = filled(path)
    index.reset()
    assert index.entries == [] and path.stat().st_size == 0
    index.append(AbortedTxn(1, 100, 110, 111))
    moved = tmp_path / (path.name + ".deleted")
    index.rename(moved)
    assert moved.exists() and not path.exists()
    index.append(AbortedTxn(2, 111, 112, 113))          # the open file followed the rename
    index.flush()
    assert moved.stat().st_size == 2 * ENTRY_SIZE
    index.delete()
    assert not moved.exists()


def test_aborted_entries_lso():
    # Alone: the LSO moves to just past the marker.
    assert aborted_entries([CompletedTxn(1, 100, 110, True)], None) == [AbortedTxn(1, 100, 110, 111)]
    # Another transaction still open (from offset 95) holds the LSO back.
    assert aborted_entries([CompletedTxn(1, 100, 110, True)], 95) == [AbortedTxn(1, 100, 110, 95)]
    # Commits get no entry; a transaction ended later in the same append was still open.
    completed = [CompletedTxn(1, 100, 110, True), CompletedTxn(2, 103, 111, False), CompletedTxn(3, 105, 112, True)]
    assert aborted_entries(completed, None) == [AbortedTxn(1, 100, 110, 103), AbortedTxn(3, 105, 112, 113)]
