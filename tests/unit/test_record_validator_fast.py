"""The numpy fast path of the record validator (issue 11, F5/F6) accepts only batches the full
walk accepts, and does take the common shape (no headers, short varints), which is what makes
produce cheap."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kio.serial.readers import read_signed_varint

from ottla.records.batch import HEADER_SIZE, read_header
from ottla.records.records import Record, build_batch
from ottla.records.validator import _fast_walk, _walk

_records = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=80)),
                              st.one_of(st.none(), st.binary(max_size=10), st.binary(min_size=60, max_size=9000)),
                              st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=5)), max_size=1)),
                    min_size=1, max_size=150)
_plain = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=5)), st.one_of(st.none(), st.binary(max_size=5), st.binary(min_size=60, max_size=200)),
                            st.just([])), min_size=1, max_size=150)  # the shape the fast path takes


def _records_section(records, stamp_step: int = 37) -> tuple[bytearray, int]:
    batch = build_batch([Record(k, v, tuple(h), 1_000 + i * stamp_step) for i, (k, v, h) in enumerate(records)])
    return bytearray(batch[HEADER_SIZE:]), read_header(batch).records_count


def _record_starts(data: bytes) -> list[int]:
    starts, position = [], 0
    while position < len(data):
        starts.append(position)
        length, size = read_signed_varint(memoryview(data), position)
        position += size + length
    return starts


@settings(max_examples=500, deadline=None)
@given(_plain, st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 9) | st.integers(0, 1 << 16),
                                  st.integers(-3, 3) | st.integers(0, 255)), min_size=1, max_size=3),
       st.integers(-2, 2), st.sampled_from([37, 5_000, 100_000]))  # stamp deltas of 2, 3 and 4 bytes
@example([(None, None, [])] * 2, [(0, 4, 2)], 0, 37)   # a key of length -2
@example([(None, None, [])] * 2, [(0, 5, 2)], 0, 37)   # a value of length -2
@example([(None, None, [])] * 2, [(0, 6, 2)], 0, 37)   # one header and no bytes for it
@example([(None, None, [])] * 2, [(1, 3, -2)], 0, 37)  # offset deltas 0, 0
@example([(None, None, [])] * 2, [(0, 0, 1)], 0, 37)   # a negative record length
def test_the_fast_path_accepts_only_what_the_walk_accepts(records, mutations, count_change, stamp_step):
    """Small changes to the fields near a record's start make the subtle lies (a header count
    with no headers, a key of length -2, a repeated offset delta)."""
    data, count = _records_section(records, stamp_step)
    starts = _record_starts(bytes(data))
    for record, field, change in mutations:
        position = (starts[record % len(starts)] + field) % len(data)
        data[position] = (data[position] + change) % 256
    count += count_change
    if _fast_walk(memoryview(bytes(data)), count):
        assert _walk(memoryview(bytes(data)), count) == count


def _record_lengths(data: bytes) -> list[int]:
    return [read_signed_varint(memoryview(data), start)[0] for start in _record_starts(data)]


@settings(max_examples=200, deadline=None)
@given(_records, st.sampled_from([37, 5_000]))  # stamp deltas of up to 2 and 3 bytes
@example([(None, bytes(8_000), [])], 37)  # record length 8,009: a two-byte varint, the common shape
@example([(None, bytes(8_184), [])], 37)  # 8,191: the longest length of two varint bytes
@example([(None, bytes(8_185), [])], 37)  # 8,192: a three-byte length, left to the walk
def test_the_fast_path_agrees_with_the_walk_on_well_formed_batches(records, stamp_step):
    data, count = _records_section(records, stamp_step)
    # The common shape: no headers, and each record's length a varint of at most two bytes.
    fits = all(not h for _, _, h in records) and all(n < 1 << 13 for n in _record_lengths(bytes(data)))
    assert _fast_walk(memoryview(bytes(data)), count) is fits  # the common shape is never left to the slow walk
    assert _walk(memoryview(bytes(data)), count) == count


@pytest.mark.parametrize("count", [0, 2**31 - 1])
def test_impossible_counts_are_left_to_the_walk(count):
    data, _ = _records_section([(None, b"v", [])])
    assert _fast_walk(memoryview(bytes(data)), count) is False


def _offset_delta_position(data: bytes, start: int) -> int:
    """Where a record's offset delta starts: after its length, attributes and timestamp delta."""
    view = memoryview(data)
    _, length_size = read_signed_varint(view, start)
    _, stamp_size = read_signed_varint(view, start + length_size + 1)
    return start + length_size + 1 + stamp_size


def test_a_full_librdkafka_batch_takes_the_fast_path():
    """librdkafka sends up to 10,000 records a batch (batch.num.messages); offset deltas from
    8,192 on take three bytes, and such batches were left to the slow walk (5x the time)."""
    data, count = _records_section([(None, bytes(100), [])] * 10_000)
    assert _fast_walk(memoryview(bytes(data)), count) is True


def test_a_wrong_three_byte_offset_delta_is_refused_by_both_paths():
    data, count = _records_section([(None, bytes(100), [])] * 10_000)
    position = _offset_delta_position(bytes(data), _record_starts(bytes(data))[9_000])
    assert data[position] >= 0x80 and data[position + 1] >= 0x80  # a three-byte varint
    data[position] ^= 0x02  # 9,000 becomes 8,999 or 9,001
    assert _fast_walk(memoryview(bytes(data)), count) is False
    with pytest.raises(ValueError, match="offset delta"):
        _walk(memoryview(bytes(data)), count)


# Records of one size: the chain is taken a run at a time (numpy compares each record's length
# bytes with its predecessor's) once a block of records has taken equal steps.
_mutations = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 9) | st.integers(0, 1 << 16),
                                st.integers(-3, 3) | st.integers(0, 255)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.one_of(st.none(), st.binary(max_size=3)), st.integers(0, 1_100),
       st.sampled_from([0, 37, 2_000]))  # stamp deltas of up to three bytes, the fast path's reach
def test_well_formed_records_of_one_size_take_the_fast_path(count, key, value_size, stamp_step):
    """Also where their sizes step up partway (offset deltas from 64 on and stamp deltas take one
    byte more), which ends a run and starts the next."""
    data, n = _records_section([(key, bytes(value_size), [])] * count, stamp_step)
    assert _fast_walk(memoryview(bytes(data)), n) is True
    assert _walk(memoryview(bytes(data)), n) == n


@settings(max_examples=500, deadline=None)
@given(st.integers(17, 400), st.integers(0, 1_100), _mutations, st.integers(-2, 2), st.sampled_from([0, 37, 5_000]))
@example(100, 1_024, [(50, 1, 1)], 0, 0)  # inside a run, a length that differs in its second byte only
@example(100, 1_024, [(50, 0, 1)], 0, 0)  # ... and one negative, which the chain's table steps over alike
@example(100, 10, [(40, 0, 1)], 0, 0)     # the same with one-byte lengths
@example(100, 10, [(99, 8, 1)], 0, 0)     # the last record's header count
def test_runs_of_one_size_are_accepted_only_as_the_walk_accepts_them(count, value_size, mutations, count_change,
                                                                     stamp_step):
    data, n = _records_section([(None, bytes(value_size), [])] * count, stamp_step)
    starts = _record_starts(bytes(data))
    for record, field, change in mutations:
        position = (starts[record % len(starts)] + field) % len(data)
        data[position] = (data[position] + change) % 256
    n += count_change
    if _fast_walk(memoryview(bytes(data)), n):
        assert _walk(memoryview(bytes(data)), n) == n


def test_sizes_that_alternate_every_block_do_not_cost_a_run_check_per_block(monkeypatch):
    """A batch made of runs of exactly one block (16 records of one size, 16 of another, ...)
    made every block look like the start of a run: one numpy check per 16 records, and 100,000
    small records took 245-275 ms instead of 14-24. Runs too short to pay for their check make
    the checks ever rarer."""
    from ottla.records import validator

    checks = []
    real = validator._same_length
    monkeypatch.setattr(validator, "_same_length", lambda *args: checks.append(args) or real(*args))
    data, count = _records_section(([(None, b"", [])] * 16 + [(None, b"x", [])] * 16) * 3_125, 0)
    assert _fast_walk(memoryview(bytes(data)), count) is True
    assert len(checks) <= 20  # 100,000 records: a check per doubling of the stretch, not 6,250


def _uniform(data: bytes, count: int) -> bool:
    """`_uniform_runs` on a records section, as `_fast_walk` calls it."""
    import numpy as np

    from ottla.records.validator import _record_starts, _spans, _uniform_runs

    view = memoryview(data)
    buf = np.frombuffer(view, dtype=np.uint8)
    chain = _record_starts(view, buf, count) if 0 < count <= len(data) else None
    if chain is None:
        return False
    return _uniform_runs(view, buf, chain[1] if chain[1] is not None else _spans(chain[0], len(data)))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9_000), st.one_of(st.none(), st.binary(max_size=8)), st.integers(0, 300),
       st.sampled_from([0, 1, 37, 100]))  # stamp deltas of up to three bytes (< 2^20), as the fast path
def test_records_of_one_size_are_checked_a_column_at_a_time(count, key, value_size, stamp_step):
    """Runs of records of one size (Spark's sink sends 2,500 of 100 bytes a batch) are checked
    a byte column at a time, also across the offset deltas that take a byte more (64, 8,192)."""
    data, n = _records_section([(key, bytes(value_size), [])] * count, stamp_step)
    sizes = {b - a for a, b in zip(_record_starts(bytes(data)), [*_record_starts(bytes(data))[1:], len(data)])}
    assert _uniform(bytes(data), n) is (len(sizes) < 16)
    assert _walk(memoryview(bytes(data)), n) == n


@settings(max_examples=500, deadline=None)
@given(st.integers(2, 400), st.one_of(st.none(), st.binary(max_size=3)), st.integers(0, 300), _mutations,
       st.integers(-2, 2), st.sampled_from([0, 37, 5_000]))
@example(100, None, 100, [(70, 3, 1)], 0, 0)     # an offset delta one off, inside a run
@example(100, b"k", 100, [(50, 3, 128)], 0, 0)   # a key size with a continuation bit
@example(100, None, 100, [(99, 104, 1)], 0, 0)   # the last record's header count
@example(100, None, 100, [(30, 2, 128)], 0, 37)  # a timestamp delta a byte longer
def test_the_column_check_accepts_only_what_the_walk_accepts(count, key, value_size, mutations, count_change,
                                                             stamp_step):
    data, n = _records_section([(key, bytes(value_size), [])] * count, stamp_step)
    starts = _record_starts(bytes(data))
    for record, field, change in mutations:
        position = (starts[record % len(starts)] + field) % len(data)
        data[position] = (data[position] + change) % 256
    n += count_change
    if _uniform(bytes(data), n):
        assert _walk(memoryview(bytes(data)), n) == n


def test_the_chain_of_lengths_hands_its_runs_to_the_column_check():
    """Spark's sink batch (2,500 records of one size, a byte longer from offset delta 64 on): the
    chain's walk already knows its two runs, so the column check takes them without a numpy pass
    over every record's start (`_spans`)."""
    import numpy as np

    from ottla.records.validator import _record_starts

    data, n = _records_section([(b"%05d" % i, bytes(100), []) for i in range(2_500)], 0)
    view = memoryview(bytes(data))
    starts, spans = _record_starts(view, np.frombuffer(view, dtype=np.uint8), n)
    assert spans == [(0, 0, starts[1], 64), (64, int(starts[64]), starts[1] + 1, 2_436)]


@pytest.mark.parametrize("broken", [None, 5, 200])
def test_a_block_whose_steps_only_add_up_is_checked_record_by_record(broken):
    """A block of records whose lengths differ but add up to its last one's times its count looks
    like a run to the chain (sizes 99, 101, ... then 100): its span must not pass the column check,
    and the verdict stays the full walk's, a broken offset delta in it or after it included."""
    values = [bytes(99 if i % 2 else 101) for i in range(14)] + [bytes(100)] * 300
    data, n = _records_section([(None, v, []) for v in values], 0)
    if broken is not None:
        data[_record_starts(bytes(data))[broken] + 4] += 2  # its offset delta: after a 2-byte length, attributes, stamp
    assert _uniform(bytes(data), n) is False
    try:
        walked = _walk(memoryview(bytes(data)), n) == n
    except ValueError:
        walked = False
    assert walked is (broken is None)
    assert _fast_walk(memoryview(bytes(data)), n) is walked
