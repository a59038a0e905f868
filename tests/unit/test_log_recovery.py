"""Crash recovery: files left as a crash leaves them, then damaged; reopen without a clean marker."""

import logging
import os
import shutil

import pytest

from ottla.config import BrokerConfig, TopicConfig
from ottla.log import Log
from ottla.log.index import OffsetIndex
from ottla.log.segment import LogSegment
from ottla.records.batch import parse_batches
from ottla.records.control import build_control_batch
from ottla.records.records import Record, build_batch, iter_batches

CFG = TopicConfig(BrokerConfig(), {"segment.bytes": 4_000, "index.interval.bytes": 256})


def batch(i, n=2, **producer):
    records = [Record(b"key-%d" % i, b"value-%d-%d" % (i, j) * 8, (), 1_000 + i) for j in range(n)]
    return build_batch(records, **producer)


def contents(log):
    """(offset, value) of every record, read back through the fetch path."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=log.log_end_offset).records
        assert data
        for _, records in iter_batches(data):
            out += [(r.offset, r.value) for r in records if r.offset >= offset]
        offset = out[-1][0] + 1
    return out


def crashed_copy(log, tmp_path, name="copy-0"):
    """The partition directory as a crash leaves it: no close, nothing trimmed."""
    target = tmp_path / name
    shutil.copytree(log.directory, target)
    return target


@pytest.fixture
def written(tmp_path):
    log = Log(tmp_path / "orig-0", CFG)
    for i in range(60):
        log.append(batch(i), now_ms=0)
    assert len(log.segments) >= 4
    return log


def segment_files(directory, suffix):
    return sorted(p for p in directory.iterdir() if p.suffix == suffix)


def test_untouched_crash_recovers_everything(written, tmp_path):
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 120
    assert contents(recovered) == expected
    assert [s.base_offset for s in recovered.segments] == [s.base_offset for s in written.segments]


def test_torn_write_at_the_tail(written, tmp_path):
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    last = segment_files(directory, ".log")[-1]
    os.truncate(last, last.stat().st_size - 7)  # the last batch lost its end
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 118
    assert contents(recovered) == expected[:118]
    assert recovered.append(batch(99), now_ms=0).base_offset == 118
    assert [o for o, _ in contents(recovered)] == list(range(120))


@pytest.mark.parametrize(
    "tail",
    [b"\x00" * 4096, b"\x00" * 7 + b"\x77\x00\x00\x00", bytes(range(7, 107))],
    ids=["preallocated-zeros", "torn-header", "junk"],
)
def test_garbage_after_the_last_batch(written, tmp_path, tail):
    directory = crashed_copy(written, tmp_path)
    with open(segment_files(directory, ".log")[-1], "ab") as f:
        f.write(tail)
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 120
    assert recovered.append(batch(0), now_ms=0).base_offset == 120


@pytest.mark.parametrize("chunk", [100, 300], ids=["every-batch-bigger-than-a-chunk", "batches-straddle-chunks"])
def test_recovery_reads_batches_across_and_beyond_its_chunks(written, tmp_path, monkeypatch, chunk):
    from ottla.log import segment

    monkeypatch.setattr(segment, "_RECOVERY_CHUNK", chunk)  # 4 MiB otherwise: batches of ~200 bytes here
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    last = segment_files(directory, ".log")[-1]
    os.truncate(last, last.stat().st_size - 7)
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 118
    assert contents(recovered) == expected[:118]


def test_corrupt_crc_in_an_older_segment_cuts_the_log_there(written, tmp_path):
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    second = segment_files(directory, ".log")[1]
    headers = parse_batches(second.read_bytes())
    victim = headers[3]
    with open(second, "r+b") as f:
        f.seek(victim.position + victim.size - 1)
        byte = f.read(1)
        f.seek(victim.position + victim.size - 1)
        f.write(bytes([byte[0] ^ 0x01]))
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == victim.base_offset
    assert contents(recovered) == expected[: victim.base_offset]
    assert len(recovered.segments) == 2  # later segments could not be trusted
    assert len(segment_files(directory, ".log")) == 2
    assert recovered.append(batch(0), now_ms=0).base_offset == victim.base_offset


def test_deleted_index_below_the_recovery_point_is_rebuilt(written, tmp_path):
    written.flush()
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    index = segment_files(directory, ".index")[0]
    original = index.read_bytes()
    assert original  # the sealed first segment had entries
    index.unlink()
    (directory / index.name.replace(".index", ".timeindex")).unlink()
    recovered = Log(directory, CFG, recovery_point=written.recovery_point)
    assert index.read_bytes() == original
    assert contents(recovered) == expected


@pytest.mark.parametrize("damage", ["zeros", "half-entry"])
def test_garbled_index_is_rebuilt(written, tmp_path, damage):
    expected = contents(written)
    directory = crashed_copy(written, tmp_path)
    index = segment_files(directory, ".index")[0]
    original = index.read_bytes()
    if damage == "zeros":
        index.write_bytes(b"\x00" * len(original))
    else:
        index.write_bytes(original[:-3])
    recovered = Log(directory, CFG, recovery_point=written.segments[-1].base_offset)
    assert index.read_bytes() == original
    assert contents(recovered) == expected


def test_only_segments_from_the_recovery_point_are_scanned(written, tmp_path, monkeypatch):
    directory = crashed_copy(written, tmp_path)
    scanned = []
    real = LogSegment.recover

    def spy(self, *args, **kwargs):
        scanned.append(self.base_offset)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LogSegment, "recover", spy)
    bases = [s.base_offset for s in written.segments]
    Log(directory, CFG, recovery_point=bases[2] + 1)
    assert scanned == bases[2:]


def test_preallocated_active_index_left_by_a_crash_is_rebuilt(written, tmp_path):
    directory = crashed_copy(written, tmp_path)
    active_index = segment_files(directory, ".index")[-1]
    assert active_index.stat().st_size == 10485760  # still preallocated to segment.index.bytes
    recovered = Log(directory, CFG, recovery_point=0)
    recovered.close()
    assert active_index.stat().st_size == recovered.segments[-1].offset_index.entries * 8
    assert 0 < recovered.segments[-1].offset_index.entries < 20


def test_recovery_trims_the_preallocated_indexes_it_rebuilds(written, tmp_path):
    """Not only at the next close: a recovered broker may run for days before its active
    segment rolls, and a 1,000-partition broker would keep 2,000 files of 10 MB each."""
    directory = crashed_copy(written, tmp_path)
    assert segment_files(directory, ".index")[-1].stat().st_size == 10485760
    assert segment_files(directory, ".timeindex")[-1].stat().st_size == 10485760 // 12 * 12
    recovered = Log(directory, CFG, recovery_point=0)
    active = recovered.segments[-1]
    assert 0 < active.offset_index.entries < 20
    assert segment_files(directory, ".index")[-1].stat().st_size == active.offset_index.entries * 8
    assert segment_files(directory, ".timeindex")[-1].stat().st_size == active.time_index.entries * 12
    expected = contents(written)
    assert contents(recovered) == expected  # reads go through the trimmed index
    recovered.append(batch(60), now_ms=0)  # the next append preallocates again
    assert contents(recovered)[: len(expected)] == expected


def test_indexes_trimmed_by_recovery_are_fsynced_at_close(written, tmp_path, monkeypatch):
    """A clean shutdown must make the rebuilt entries durable, as it does an active index's:
    the next start trusts them without a rescan."""
    from ottla.log import index

    directory = crashed_copy(written, tmp_path)
    recovered = Log(directory, CFG, recovery_point=0)
    synced = []
    real = index.fsync
    monkeypatch.setattr(index, "fsync", lambda fd, path: (synced.append(path), real(fd, path)))
    recovered.close()
    active = recovered.segments[-1]
    assert {active.offset_index.path, active.time_index.path} <= set(synced)


def test_recovery_of_an_empty_active_segment_leaves_empty_indexes(tmp_path):
    log = Log(tmp_path / "e-0", CFG)
    log.append(batch(0), now_ms=0)
    log.roll(now_ms=0)
    for index in (log.active_segment.offset_index, log.active_segment.time_index):
        index.open(active=True)  # preallocated, as an active index that got its first entry
    directory = crashed_copy(log, tmp_path)
    assert segment_files(directory, ".index")[-1].stat().st_size == 10485760
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 2
    assert [p.stat().st_size for p in segment_files(directory, ".index")[-1:]] == [0]
    assert [p.stat().st_size for p in segment_files(directory, ".timeindex")[-1:]] == [0]


def test_a_small_active_segment_never_preallocates_its_indexes(tmp_path):
    """Appends too few for an index entry leave the index files empty: checking whether the
    indexes are full mapped them at their preallocated size (10 MB each), which a kill -9 then
    left for the next start's recovery to cut back, ~11 s of ftruncate over 1,000 partitions."""
    log = Log(tmp_path / "s-0", CFG)
    log.append(batch(0), now_ms=0)
    log.roll(now_ms=0)
    for i in range(1, 3):  # fewer bytes than index.interval.bytes (256) before the last
        log.append(batch(i), now_ms=0)
    assert log.active_segment.offset_index.entries == 0
    assert [p.stat().st_size for p in segment_files(log.directory, ".index")] == [0, 0]
    assert [p.stat().st_size for p in segment_files(log.directory, ".timeindex")] == [12, 0]


def test_recovery_logs_one_info_line_only_when_it_did_work(written, tmp_path, caplog):
    directory = crashed_copy(written, tmp_path)
    with caplog.at_level(logging.INFO, logger="ottla.log"):
        recovered = Log(directory, CFG, recovery_point=0)
    lines = [r for r in caplog.records if r.name == "ottla.log.loader"]
    assert len(lines) == 1 and lines[0].log_end_offset == 120
    recovered.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ottla.log"):
        Log(directory, CFG, recovery_point=120, clean_shutdown=True)
    assert not caplog.records


def test_producer_state_survives_a_crash(tmp_path):
    log = Log(tmp_path / "p-0", CFG)
    for i in range(40):  # rolls several times, so snapshots exist at some segment bases
        log.append(batch(i, producer_id=5, producer_epoch=0, base_sequence=2 * i), now_ms=0)
    log.append(batch(99, producer_id=8, producer_epoch=0, base_sequence=0, is_transactional=True), now_ms=0)
    log.append(batch(98, producer_id=6, producer_epoch=0, base_sequence=0, is_transactional=True), now_ms=0)
    log.append(build_control_batch(8, 0, 0, False, 0), now_ms=0, origin="coordinator")
    log.update_high_watermark(log.log_end_offset)  # the partition's decision, not the log's
    assert log.last_stable_offset == 82
    directory = crashed_copy(log, tmp_path)
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == 85
    assert recovered.last_stable_offset == 82  # producer 6's transaction is still open
    retry = recovered.append(batch(39, producer_id=5, producer_epoch=0, base_sequence=78), now_ms=0)
    assert retry.duplicate and retry.base_offset == 78
    assert recovered.append(batch(40, producer_id=5, producer_epoch=0, base_sequence=80), now_ms=0).base_offset == 85


K_CFG = TopicConfig(BrokerConfig(), {"index.interval.bytes": 256})  # one segment


def _restarted_then_crashed(tmp_path):
    """A log shut down cleanly at offset 20 (producer snapshot there), restarted, written on
    by producer 5 and left as a kill -9 leaves it (recovery point 20, inside the active segment)."""
    log = Log(tmp_path / "k-0", K_CFG)
    for i in range(10):
        log.append(batch(i, producer_id=5, producer_epoch=0, base_sequence=2 * i), now_ms=0)
    log.close()
    log = Log(log.directory, log.config, recovery_point=20, clean_shutdown=True)
    for i in range(10, 15):
        log.append(batch(i, producer_id=5, producer_epoch=0, base_sequence=2 * i), now_ms=0)
    return log, crashed_copy(log, tmp_path)


def test_recovery_keeps_the_snapshots_the_recovered_log_still_holds(tmp_path, monkeypatch):
    """A kill -9 after a clean restart: the snapshot at the clean end (20) describes batches
    recovery finds intact, so it stays (deleting it cost every partition an unlink and a
    directory fsync), and the state the scan rebuilt still deduplicates and continues."""
    from ottla.producer_state import manager

    _, directory = _restarted_then_crashed(tmp_path)
    synced = []
    monkeypatch.setattr(manager, "fsync_dir", synced.append)
    recovered = Log(directory, K_CFG, recovery_point=20)
    assert recovered.log_end_offset == 30
    assert sorted(p.name for p in directory.glob("*.snapshot")) == ["00000000000000000020.snapshot"]
    assert synced == []
    retry = recovered.append(batch(14, producer_id=5, producer_epoch=0, base_sequence=28), now_ms=0)
    assert retry.duplicate and retry.base_offset == 28
    assert recovered.append(batch(15, producer_id=5, producer_epoch=0, base_sequence=30), now_ms=0).base_offset == 30
    recovered.truncate_to(24)  # reloads from the kept snapshot and replays 20..23
    assert recovered.append(batch(12, producer_id=5, producer_epoch=0, base_sequence=24), now_ms=0).base_offset == 24


def test_recovery_deletes_snapshots_past_the_end_it_recovers(tmp_path):
    """The same crash with the log torn below the clean end (20): the snapshot at 20 holds
    producer 5's batches 6..9, which are gone. Kept, a later reload from it (a truncation,
    here) would take 5's resent batches for duplicates: acknowledged, never written."""
    _, directory = _restarted_then_crashed(tmp_path)
    log_file = segment_files(directory, ".log")[-1]
    torn_at = next(h for h in parse_batches(log_file.read_bytes()) if h.base_offset == 12).position + 30
    os.truncate(log_file, torn_at)
    recovered = Log(directory, K_CFG, recovery_point=20)
    assert recovered.log_end_offset == 12
    assert list(directory.glob("*.snapshot")) == []
    for i in range(6):  # another producer takes the log past 20 again
        recovered.append(batch(50 + i, producer_id=7, producer_epoch=0, base_sequence=2 * i), now_ms=0)
    recovered.truncate_to(22)  # reloads producer state: from a snapshot at or below 22, if any
    resent = recovered.append(batch(6, producer_id=5, producer_epoch=0, base_sequence=12), now_ms=0)
    assert not resent.duplicate and resent.base_offset == 22


def test_batches_without_a_producer_id_between_producers_recover_alike(tmp_path):
    """Recovery hands producer state only the batches that carry a producer id: plain batches
    in between (most of an internal topic) change nothing it knows but its end offset."""
    log = Log(tmp_path / "m-0", CFG)
    for i in range(30):
        log.append(batch(i), now_ms=0)  # no producer id
        log.append(batch(100 + i, producer_id=5, producer_epoch=0, base_sequence=2 * i), now_ms=0)
        if i % 10 == 9:
            log.append(batch(200 + i, producer_id=9, producer_epoch=0, base_sequence=2 * (i // 10),
                             is_transactional=True), now_ms=0)
            log.append(build_control_batch(9, 0, 0, i != 19, 0), now_ms=0, origin="coordinator")
    log.append(batch(300, producer_id=9, producer_epoch=0, base_sequence=6, is_transactional=True), now_ms=0)
    log.append(batch(301), now_ms=0)
    log.update_high_watermark(log.log_end_offset)
    aborted = [t for segment in log.segments for t in segment.txn_index.entries]
    assert len(aborted) == 1
    directory = crashed_copy(log, tmp_path)
    recovered = Log(directory, CFG, recovery_point=0)
    assert recovered.log_end_offset == log.log_end_offset
    assert recovered.last_stable_offset == log.last_stable_offset < log.log_end_offset  # 9's last txn open
    assert [t for segment in recovered.segments for t in segment.txn_index.entries] == aborted
    assert recovered.producer_state.map_end_offset == log.log_end_offset
    retry = recovered.append(batch(129, producer_id=5, producer_epoch=0, base_sequence=58), now_ms=0)
    assert retry.duplicate
    assert contents(recovered) == contents(log)


def test_transaction_index_is_rebuilt_by_recovery(tmp_path):
    log = Log(tmp_path / "x-0", CFG)
    for i in range(30):  # transaction i: offsets 3i, 3i+1, marker 3i+2; every third one commits
        log.append(batch(i, producer_id=1, producer_epoch=0, base_sequence=2 * i, is_transactional=True), now_ms=0)
        log.append(build_control_batch(1, 0, 0, i % 3 == 0, 0), now_ms=0, origin="coordinator")

    def aborted(log):
        return [t for segment in log.segments for t in segment.txn_index.entries]

    expected = aborted(log)
    assert [(t.first_offset, t.last_offset) for t in expected] == [(3 * i, 3 * i + 2) for i in range(30) if i % 3]
    directory = crashed_copy(log, tmp_path)
    for path in directory.glob("*.txnindex"):
        path.unlink()
    recovered = Log(directory, CFG, recovery_point=0)
    assert aborted(recovered) == expected
    fetched = recovered.read(0, 1 << 20, max_offset=90, with_aborted=True)
    end = recovered.segments[1].base_offset
    assert fetched.aborted_transactions == [t for t in expected if t.first_offset < end]


def test_recovery_never_reads_the_index_it_rebuilds(written, tmp_path, monkeypatch):
    """A crash leaves the active segment's index untrimmed (10 MB preallocated, untrusted);
    rebuilding producer state up to that segment must not look anything up in it: on a broker
    with 1,000 empty partitions those lookups were most of a restart (page faults into the
    sparse files, seconds)."""
    directory = crashed_copy(written, tmp_path)
    looked_up = []
    real = OffsetIndex.lookup

    def spy(self, offset):
        looked_up.append((self.base_offset, offset))
        return real(self, offset)

    monkeypatch.setattr(OffsetIndex, "lookup", spy)
    bases = [s.base_offset for s in written.segments]
    recovered = Log(directory, CFG, recovery_point=bases[-1] + 1)
    assert recovered.log_end_offset == 120
    assert [base for base, _ in looked_up if base >= bases[-1]] == []
