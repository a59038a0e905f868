"""The __consumer_offsets formats and the group -> partition hash, checked against Kafka's bytes."""

import struct

import pytest

from ottla.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
)
from ottla.coordinator.partitioning import java_string_hash, partition_for

# (group id, String.hashCode(), partition of 50) printed by OpenJDK 17 running
# `s.hashCode()` and `(h == Integer.MIN_VALUE ? 0 : Math.abs(h)) % 50`.
JAVA_VALUES = [
    ("", 0, 0),
    ("a", 97, 47),
    ("test-group", 627841412, 12),
    ("my-consumer-group", 1513705513, 13),
    ("console-consumer-12345", 158455506, 6),
    ("组", 32452, 2),
    ("\U0001F600emoji", -1233692477, 27),  # a surrogate pair: two UTF-16 code units
    ("polygenelubricants", -2147483648, 0),  # Integer.MIN_VALUE: Kafka's abs maps it to 0
    ("DESIGNING WORKHOUSES", -2147483648, 0),
]


@pytest.mark.parametrize("group, java_hash, partition", JAVA_VALUES)
def test_hash_and_partition_match_java(group, java_hash, partition):
    assert java_string_hash(group) == java_hash
    assert partition_for(group, 50) == partition


def test_partition_for_min_value_with_other_counts():
    # Math.abs(MIN_VALUE) is negative in Java; Kafka's Utils.abs avoids a negative partition.
    assert partition_for("polygenelubricants", 7) == 0
    assert partition_for("a", 7) == 97 % 7


def _s(text):
    return struct.pack(">h", len(text.encode())) + text.encode()


def test_offset_commit_key_bytes():
    key = encode_key(OffsetCommitKey("g1", "orders", 5))
    assert key == struct.pack(">h", 1) + _s("g1") + _s("orders") + struct.pack(">i", 5)
    assert decode_key(key) == OffsetCommitKey("g1", "orders", 5)
    # Version 0 keys (written by old brokers) have the same layout.
    assert decode_key(struct.pack(">h", 0) + key[2:]) == OffsetCommitKey("g1", "orders", 5)


def test_group_metadata_key_bytes():
    key = encode_key(GroupMetadataKey("g1"))
    assert key == struct.pack(">h", 2) + _s("g1")
    assert decode_key(key) == GroupMetadataKey("g1")


def test_unknown_key_types_are_skipped():
    # Type 3+ are KIP-848 consumer-group records; a classic coordinator ignores them.
    assert decode_key(struct.pack(">h", 3) + _s("g1")) is None


def test_offset_commit_value_v3_bytes():
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=7)
    data = encode_offset_commit_value(value)
    assert data == struct.pack(">hqi", 3, 42, 7) + _s("m") + struct.pack(">q", 1000)
    assert decode_offset_commit_value(data) == value


def test_offset_commit_value_v1_when_expire_timestamp_is_set():
    value = OffsetCommitValue(offset=42, metadata="", commit_timestamp=1000, expire_timestamp=5000)
    data = encode_offset_commit_value(value)
    assert data == struct.pack(">hq", 1, 42) + _s("") + struct.pack(">qq", 1000, 5000)
    assert decode_offset_commit_value(data) == value


def test_offset_commit_value_older_and_flexible_versions_decode():
    v0 = struct.pack(">hq", 0, 9) + _s("x") + struct.pack(">q", 77)
    assert decode_offset_commit_value(v0) == OffsetCommitValue(9, "x", 77)
    v2 = struct.pack(">hq", 2, 9) + _s("x") + struct.pack(">q", 77)
    assert decode_offset_commit_value(v2) == OffsetCommitValue(9, "x", 77)
    # v4: compact string (length + 1 as a varint) and an empty tagged-field section.
    v4 = struct.pack(">hqi", 4, 9, 3) + bytes([2]) + b"x" + struct.pack(">q", 77) + bytes([0])
    assert decode_offset_commit_value(v4) == OffsetCommitValue(9, "x", 77, leader_epoch=3)


def test_offset_commit_value_rejects_unknown_version_and_truncation():
    with pytest.raises(RecordFormatError):
        decode_offset_commit_value(struct.pack(">hq", 9, 1))
    with pytest.raises(RecordFormatError):
        decode_offset_commit_value(struct.pack(">hq", 3, 1))


def _member(member_id="m-1", instance=None):
    return MemberMetadataValue(member_id, instance, "client", "/127.0.0.1", 300000, 45000, b"sub", b"asg")


def test_group_metadata_value_v3_bytes():
    value = GroupMetadataValue("consumer", 3, "range", "m-1", 123456, (_member(instance="i-1"),))
    data = encode_group_metadata_value(value)
    expected = (
        struct.pack(">h", 3) + _s("consumer") + struct.pack(">i", 3) + _s("range") + _s("m-1")
        + struct.pack(">q", 123456) + struct.pack(">i", 1)
        + _s("m-1") + _s("i-1") + _s("client") + _s("/127.0.0.1") + struct.pack(">ii", 300000, 45000)
        + struct.pack(">i", 3) + b"sub" + struct.pack(">i", 3) + b"asg"
    )
    assert data == expected
    assert decode_group_metadata_value(data) == value


def test_empty_group_metadata_has_null_protocol_and_leader():
    value = GroupMetadataValue("consumer", 4, None, None, 99, ())
    data = encode_group_metadata_value(value)
    assert data == struct.pack(">h", 3) + _s("consumer") + struct.pack(">ihhqi", 4, -1, -1, 99, 0)
    assert decode_group_metadata_value(data) == value


def test_group_metadata_value_old_versions_decode():
    member_v0 = _s("m-1") + _s("client") + _s("/h") + struct.pack(">i", 10000) + struct.pack(">i", 1) + b"s" \
        + struct.pack(">i", 1) + b"a"
    v0 = struct.pack(">h", 0) + _s("consumer") + struct.pack(">i", 1) + _s("range") + _s("m-1") \
        + struct.pack(">i", 1) + member_v0
    decoded = decode_group_metadata_value(v0)
    assert decoded.current_state_timestamp == -1
    assert decoded.members == (MemberMetadataValue("m-1", None, "client", "/h", 10000, 10000, b"s", b"a"),)
    member_v1 = _s("m-1") + _s("client") + _s("/h") + struct.pack(">ii", 20000, 10000) + struct.pack(">i", 1) \
        + b"s" + struct.pack(">i", 1) + b"a"
    v2 = struct.pack(">h", 2) + _s("consumer") + struct.pack(">i", 1) + _s("range") + _s("m-1") \
        + struct.pack(">q", 555) + struct.pack(">i", 1) + member_v1
    decoded = decode_group_metadata_value(v2)
    assert decoded.current_state_timestamp == 555
    assert decoded.members[0].rebalance_timeout == 20000 and decoded.members[0].session_timeout == 10000
