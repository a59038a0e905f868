"""`__transaction_state` record formats and transactional-id partitioning."""

from __future__ import annotations

import struct

import pytest

from ottla.coordinator.transaction.log_format import (
    TxnLogValue,
    TxnState,
    decode_key,
    decode_records,
    decode_value,
    encode_key,
    encode_value,
)
from ottla.coordinator.partitioning import java_string_hash, partition_for

# Computed with OpenJDK 17: s.hashCode(), and Kafka's Utils.abs(h) % 50.
JAVA_HASHES = [
    ("", 0, 0),
    ("a", 97, 47),
    ("abc", 96354, 4),
    ("polygenelubricants", -2147483648, 0),  # Integer.MIN_VALUE: Utils.abs maps it to 0
    ("my-txn", -1061187895, 45),
    ("orders-etl-7", -405761249, 49),
    ("\u00e9t\u00e9", 227742, 42),
    ("\U0001F600-txn", 928373504, 4),  # hashed over the UTF-16 surrogate pair
    ("transactional-id-0", 1051133890, 40),
    ("txn-app-42", -864488851, 1),
    ("consumer-group-1", 147483020, 20),
    ("Hello World!", -969099747, 47),
]


@pytest.mark.parametrize("text,java_hash,partition", JAVA_HASHES)
def test_hash_and_partition_match_kafka(text, java_hash, partition):
    assert java_string_hash(text) == java_hash
    assert partition_for(text, 50) == partition


def test_partition_for_other_counts():
    # Same values with 7 partitions (from the same JVM run).
    assert [partition_for(t, 7) for t in ("a", "my-txn", "polygenelubricants", "Hello World!")] == [6, 5, 0, 0]


def test_key_bytes():
    assert encode_key("tx") == b"\x00\x00\x00\x02tx"
    assert decode_key(encode_key("été")) == "été"


def _v0_golden() -> bytes:
    # version, producer id, epoch, timeout, status, [topic [partition]], last update, start
    return (struct.pack(">hqhib", 0, 1000, 3, 60000, 1)
            + struct.pack(">i", 2)
            + struct.pack(">h", 6) + b"orders" + struct.pack(">iii", 2, 0, 4)
            + struct.pack(">h", 8) + b"payments" + struct.pack(">ii", 1, 7)
            + struct.pack(">qq", 1_700_000_000_500, 1_700_000_000_000))


def _ongoing() -> TxnLogValue:
    return TxnLogValue(producer_id=1000, producer_epoch=3, timeout_ms=60000, state=TxnState.ONGOING,
                       partitions=frozenset({("payments", 7), ("orders", 4), ("orders", 0)}),
                       last_update_ms=1_700_000_000_500, start_ms=1_700_000_000_000)


def test_value_v0_bytes():
    assert encode_value(_ongoing()) == _v0_golden()
    assert decode_value(_v0_golden()) == _ongoing()


def test_empty_state_writes_null_partition_list():
    empty = TxnLogValue(producer_id=7, producer_epoch=0, timeout_ms=1000, state=TxnState.EMPTY,
                        partitions=frozenset(), last_update_ms=5, start_ms=-1)
    assert encode_value(empty) == struct.pack(">hqhibiqq", 0, 7, 0, 1000, 0, -1, 5, -1)
    assert decode_value(encode_value(empty)) == empty
    with pytest.raises(ValueError):
        encode_value(TxnLogValue(producer_id=7, producer_epoch=0, timeout_ms=1000, state=TxnState.EMPTY,
                                 partitions=frozenset({("t", 0)}), last_update_ms=5, start_ms=-1))


def test_value_v1_flexible_layout_and_tags():
    value = TxnLogValue(producer_id=1000, producer_epoch=3, timeout_ms=60000, state=TxnState.PREPARE_COMMIT,
                        partitions=frozenset({("t", 1)}), last_update_ms=9, start_ms=8,
                        previous_producer_id=999, next_producer_epoch=4)
    data = encode_value(value, version=1)
    expected = (struct.pack(">hqhib", 1, 1000, 3, 60000, 2)
                + bytes([2])                                   # compact array: 1 topic
                + bytes([2]) + b"t"                            # compact string
                + bytes([2]) + struct.pack(">i", 1)            # compact array: 1 partition
                + bytes([0])                                   # partition entry's tagged fields
                + struct.pack(">qq", 9, 8)
                + bytes([2])                                   # two tagged fields, by tag
                + bytes([0, 8]) + struct.pack(">q", 999)       # tag 0 PreviousProducerId
                + bytes([3, 2]) + struct.pack(">h", 4))        # tag 3 NextProducerEpoch
    assert data == expected
    assert decode_value(data) == value


def test_v1_defaults_are_not_written_and_unknown_tags_are_skipped():
    plain = TxnLogValue(producer_id=1, producer_epoch=0, timeout_ms=10, state=TxnState.EMPTY,
                        partitions=frozenset(), last_update_ms=1, start_ms=-1)
    data = encode_value(plain, version=1)
    assert data.endswith(b"\x00")
    with_unknown_tag = data[:-1] + bytes([1, 9, 3]) + b"xyz"
    assert decode_value(with_unknown_tag) == plain


def test_all_tagged_fields_round_trip():
    value = TxnLogValue(producer_id=1, producer_epoch=5, timeout_ms=10, state=TxnState.COMPLETE_ABORT,
                        partitions=frozenset(), last_update_ms=1, start_ms=0, previous_producer_id=2,
                        next_producer_id=3, next_producer_epoch=0, client_transaction_version=2)
    assert decode_value(encode_value(value, version=1)) == value


@pytest.mark.parametrize("bad", [
    b"",
    b"\x00",
    _v0_golden()[:-1],
    _v0_golden() + b"\x00",
    struct.pack(">h", 2) + _v0_golden()[2:],
    _v0_golden()[:16] + b"\x09" + _v0_golden()[17:],
], ids=["empty", "short", "truncated", "trailing", "unknown-version", "unknown-state"])
def test_malformed_values_raise_value_error(bad):
    with pytest.raises(ValueError):
        decode_value(bad)


def test_replay_keeps_last_record_and_applies_tombstones():
    first = _ongoing()
    later = TxnLogValue(producer_id=1000, producer_epoch=3, timeout_ms=60000, state=TxnState.COMPLETE_COMMIT,
                        partitions=frozenset(), last_update_ms=2, start_ms=1)
    records = [
        (encode_key("a"), encode_value(first)),
        (encode_key("b"), encode_value(first)),
        (struct.pack(">h", 1) + b"\x00\x01x", b"a future record type"),   # skipped, like Kafka
        (encode_key("a"), encode_value(later)),
        (encode_key("b"), None),
    ]
    assert decode_records(records) == {"a": later}


def test_state_names_and_ids():
    assert [(s.id, s.display_name) for s in TxnState] == [
        (0, "Empty"), (1, "Ongoing"), (2, "PrepareCommit"), (3, "PrepareAbort"),
        (4, "CompleteCommit"), (5, "CompleteAbort"), (6, "Dead"), (7, "PrepareEpochFence")]
    assert TxnState.from_name("PrepareAbort") is TxnState.PREPARE_ABORT
    assert TxnState.from_name("prepareabort") is None
