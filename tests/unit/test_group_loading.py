"""Loading `__consumer_offsets` from the log's own bytes (the broker's path: record sets walked
by `records/scan.py`, last record per key) ends in the same groups, offsets and open
transactions as replaying the same history record by record."""

from __future__ import annotations

from ottla.coordinator.group import StoredRecord
from ottla.coordinator.group.records import OffsetCommitKey, OffsetCommitValue, encode_key, encode_offset_commit_value
from ottla.errors import ErrorCode
from ottla.records.batch import read_header, set_base_offset
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch

from tests.unit.test_group_coordinator import (
    Box,
    MemoryStore,
    commit,
    fetched,
    form_group,
    make,
    state,
    txn_commit,
)

E = ErrorCode


class BytesStore(MemoryStore):
    """Keeps what MemoryStore keeps, and the same history as v2 batches, as the log holds it."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[int, bytearray] = {}

    def _append_batch(self, partition, batch):
        data = self.bytes.setdefault(partition, bytearray())
        batch = bytearray(batch)
        set_base_offset(batch, 0, len(self.log[partition]))
        data += batch

    def append(self, partition, records, on_durable, *, producer_id=-1, producer_epoch=-1):
        self._append_batch(partition, build_batch([Record(k, v, (), 1) for k, v in records], producer_id=producer_id,
                                                  producer_epoch=producer_epoch, is_transactional=producer_id >= 0))
        super().append(partition, records, on_durable, producer_id=producer_id, producer_epoch=producer_epoch)

    def marker(self, partition, producer_id, commit):
        self._append_batch(partition, build_control_batch(producer_id, 0, 0, commit, 1))
        super().marker(partition, producer_id, commit)

    def raw(self, partition, key, value):
        """A record written by someone else (an older Kafka): in both histories."""
        self._append_batch(partition, build_batch([Record(key, value, (), 1)]))
        self.log[partition].append(StoredRecord(len(self.log[partition]), key, value))


class FromBytes:
    """The same partitions served as record sets, split at batch boundaries like the runtime's reads."""

    def __init__(self, store: BytesStore):
        self.store = store

    def load(self, partition):
        return [bytes(self.store.bytes.get(partition, b""))]

    def append(self, *args, **kwargs):
        self.store.append(*args, **kwargs)


def _history(c, store):
    ids, gen, _ = form_group(c, 2)
    for i in range(200):
        commit(c, 1 + i, {("t", i % 3): i, ("u", 0): 1000 + i}, member_id=ids[i % 2], generation=gen)
    commit(c, 300, {("x", 0): 5, ("x", 1): 6}, group="simple")
    box = Box()
    c.delete_offsets(group_id="simple", partitions=[("x", 0)], now_ms=301, on_complete=box)
    assert box.value.error == E.none
    commit(c, 302, {("y", 0): 1}, group="gone")
    box = Box()
    c.delete_groups(group_ids=["gone"], now_ms=303, on_complete=box)
    assert box.value == {"gone": E.none}
    partition = c.partition_for("txn")
    txn_commit(c, 304, {("t", 0): 50}, producer_id=7, group="txn")
    commit(c, 305, {("t", 0): 60}, group="txn")  # later than the transactional record: wins
    txn_commit(c, 306, {("t", 1): 51}, producer_id=7, group="txn")
    txn_commit(c, 307, {("t", 2): 52}, producer_id=8, group="txn")
    txn_commit(c, 308, {("t", 3): 53}, producer_id=9, group="txn")
    store.marker(partition, 7, commit=True)
    store.marker(partition, 8, commit=False)
    # OffsetCommitKey v0 (older Kafka) and v1 name the same offset; the later record wins.
    v0, v1 = (version + encode_key(OffsetCommitKey("legacy", "t", 0))[2:] for version in (b"\x00\x00", b"\x00\x01"))
    legacy = c.partition_for("legacy")
    for key, offset in ((v1, 8), (v0, 7), (v1, 11), (v1[:-1] + b"\x01", 9), (v0[:-1] + b"\x01", 10)):
        store.raw(legacy, key, encode_offset_commit_value(OffsetCommitValue(offset, "", 1)))
    return gen


def _view(c):
    txn_fetch = fetched(c, group="txn", partitions=[("t", 0), ("t", 1), ("t", 2), ("t", 3)], require_stable=True)
    return (fetched(c), state(c), c.describe_group("g").members, fetched(c, group="simple"),
            c.describe_group("gone").error, txn_fetch, fetched(c, group="legacy"))


def test_loading_the_logs_bytes_matches_replaying_its_records():
    store = BytesStore()
    original = make(store)
    _history(original, store)
    from_records = make(store)
    from_bytes = make(FromBytes(store))
    expected = _view(from_records)
    assert expected[0] == {("t", 0): 198, ("t", 1): 199, ("t", 2): 197, ("u", 0): 1199}
    assert expected[3] == {("x", 1): 6}
    assert expected[4] == E.group_id_not_found
    assert expected[5] == {("t", 0): 60, ("t", 1): 51, ("t", 2): -1, ("t", 3): E.unstable_offset_commit}
    assert expected[6] == {("t", 0): 11, ("t", 1): 10}
    assert _view(from_bytes) == expected
    # The open transaction is still pending after a load from bytes, and completes.
    from_bytes.complete_txn(producer_id=9, partitions=[from_bytes.partition_for("txn")], commit=True, now_ms=400)
    assert fetched(from_bytes, group="txn", partitions=[("t", 3)]) == {("t", 3): 53}


def test_a_load_in_several_record_sets_is_the_same_load():
    store = BytesStore()
    original = make(store)
    _history(original, store)

    class Split(FromBytes):
        def load(self, partition):
            data = bytes(self.store.bytes.get(partition, b""))
            # cut after every batch: what a small `load_chunk_bytes` does
            sets, position = [], 0
            while position < len(data):
                size = read_header(data, position).size
                sets.append(data[position:position + size])
                position += size
            return sets

    assert _view(make(Split(store))) == _view(make(FromBytes(store)))


def test_commits_from_the_bytes_path_keep_their_log_offsets():
    """A transactional commit that completes after a reload is ordered against the loaded plain
    commit by log position, as Kafka does: the loaded plain commit must carry its offset."""
    store = BytesStore()
    c = make(store)
    txn_commit(c, 0, {("t", 0): 5}, producer_id=7)
    commit(c, 1, {("t", 0): 6})
    reloaded = make(FromBytes(store))
    reloaded.complete_txn(producer_id=7, partitions=[reloaded.partition_for("g")], commit=True, now_ms=2)
    assert fetched(reloaded) == {("t", 0): 6}
