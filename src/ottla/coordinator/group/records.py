"""Records of the `__consumer_offsets` topic, byte for byte as Kafka writes them.

Every key starts with an int16 version that doubles as the record type: 0 and 1 are
OffsetCommitKey (group, topic, partition), 2 is GroupMetadataKey (group); higher types
belong to the KIP-848/share/streams groups, which a classic coordinator skips. Values start
with their own int16 version. OffsetCommitValue is written at v3 (offset, leader epoch,
metadata, commit timestamp), or v1 when the commit carries an explicit expire timestamp
(OffsetCommit v2-v4 retention_time_ms). GroupMetadataValue is written at v3. Readers accept
every version Kafka has defined (v4 of both values is the flexible encoding), so a log
written by Kafka loads here and tools that read Kafka's offsets topic read ours. A null
value is a tombstone: compaction then drops the key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from ..record_reader import RecordFormatError, RecordReader

OFFSETS_TOPIC = "__consumer_offsets"

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int = -1  # only in v1; -1 means "expire by the broker's retention"


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadataValue, ...]


# --- encoding -------------------------------------------------------------------------


def _string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    data = value.encode()
    out += _I16.pack(len(data))
    out += data


def _bytes(out: bytearray, value: bytes) -> None:
    out += _I32.pack(len(value))
    out += value


def encode_key(key: OffsetCommitKey | GroupMetadataKey) -> bytes:
    out = bytearray()
    if isinstance(key, OffsetCommitKey):
        out += _I16.pack(OFFSET_COMMIT_KEY_VERSION)
        _string(out, key.group)
        _string(out, key.topic)
        out += _I32.pack(key.partition)
    else:
        out += _I16.pack(GROUP_METADATA_KEY_VERSION)
        _string(out, key.group)
    return bytes(out)


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    out = bytearray()
    if value.expire_timestamp >= 0:
        out += _I16.pack(1)
        out += _I64.pack(value.offset)
        _string(out, value.metadata)
        out += _I64.pack(value.commit_timestamp)
        out += _I64.pack(value.expire_timestamp)
    else:
        out += _I16.pack(3)
        out += _I64.pack(value.offset)
        out += _I32.pack(value.leader_epoch)
        _string(out, value.metadata)
        out += _I64.pack(value.commit_timestamp)
    return bytes(out)


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    out = bytearray(_I16.pack(GROUP_METADATA_VALUE_VERSION))
    _string(out, value.protocol_type)
    out += _I32.pack(value.generation)
    _string(out, value.protocol)
    _string(out, value.leader)
    out += _I64.pack(value.current_state_timestamp)
    out += _I32.pack(len(value.members))
    for member in value.members:
        _string(out, member.member_id)
        _string(out, member.group_instance_id)
        _string(out, member.client_id)
        _string(out, member.client_host)
        out += _I32.pack(member.rebalance_timeout)
        out += _I32.pack(member.session_timeout)
        _bytes(out, member.subscription)
        _bytes(out, member.assignment)
    return bytes(out)


# --- decoding -------------------------------------------------------------------------


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key's record, or None for record types a classic coordinator does not use."""
    reader = RecordReader(data)
    version = reader.int16()
    if version in (0, 1):
        return OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == 2:
        return GroupMetadataKey(reader.string())
    return None


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    version = _I16.unpack_from(data)[0] if len(data) >= 2 else -1
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown OffsetCommitValue version {version}")
    reader = RecordReader(data[2:], flexible=version >= 4)
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string()
    commit_timestamp = reader.int64()
    expire_timestamp = reader.int64() if version == 1 else -1
    reader.tagged_fields()
    return OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    version = _I16.unpack_from(data)[0] if len(data) >= 2 else -1
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown GroupMetadataValue version {version}")
    reader = RecordReader(data[2:], flexible=version >= 4)
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    current_state_timestamp = reader.int64() if version >= 2 else -1
    members = []
    for _ in range(reader.array_length()):
        member_id = reader.string()
        group_instance_id = reader.nullable_string() if version >= 3 else None
        client_id = reader.string()
        client_host = reader.string()
        rebalance_timeout = reader.int32() if version >= 1 else None
        session_timeout = reader.int32()
        subscription = reader.bytes_()
        assignment = reader.bytes_()
        reader.tagged_fields()
        members.append(MemberMetadataValue(
            member_id, group_instance_id, client_id, client_host,
            # v0 had a single timeout, which served as the rebalance timeout too
            session_timeout if rebalance_timeout is None else rebalance_timeout,
            session_timeout, subscription, assignment,
        ))
    reader.tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader,
                              current_state_timestamp, tuple(members))
