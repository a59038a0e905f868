"""Records of the `__transaction_state` topic, byte for byte as Kafka writes them.

Key (TransactionLogKey v0): int16 version 0, then the transactional id as an int16-length
string. Value: int16 version, then TransactionLogValue at that version. Version 0 is the
classic fixed layout; version 1 is a flexible version (compact strings and arrays, tagged
fields) that adds the previous/next producer id, the next producer epoch and the client's
transaction version as tagged fields. A null value is the tombstone of an expired id.

Keeping Kafka's exact format means a Kafka broker could read our log and vice versa, and the
kafka-dump-log style tools apply unchanged.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Iterable
from ..record_reader import RecordReader

TRANSACTION_STATE_TOPIC = "__transaction_state"

TopicPartition = tuple[str, int]

KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)

# Tags of TransactionLogValue's tagged fields (flexible version 1).
_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2
_TAG_NEXT_PRODUCER_EPOCH = 3


class TxnState(enum.Enum):
    """Transaction states with the ids stored in the log and the names the admin APIs show."""

    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    def __init__(self, state_id: int, display_name: str):
        self.id = state_id
        self.display_name = display_name

    @classmethod
    def from_id(cls, state_id: int) -> "TxnState":
        for state in cls:
            if state.id == state_id:
                return state
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> "TxnState | None":
        for state in cls:
            if state.display_name == name:
                return state
        return None


class UnknownKeyVersion(ValueError):
    """A key written by a newer broker for a record type we do not know; loaders skip it."""


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """One TransactionLogValue: the whole state of a transactional id at one moment."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    next_producer_epoch: int = -1
    client_transaction_version: int = 0


# ---------------------------------------------------------------------------------------
# Partitioning


# ---------------------------------------------------------------------------------------
# Encoding


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode("utf-8")
    return struct.pack(">hh", KEY_VERSION, len(raw)) + raw


def decode_key(data: bytes) -> str:
    reader = RecordReader(data)
    version = reader.int16()
    if version != KEY_VERSION:
        raise UnknownKeyVersion(f"unknown __transaction_state key version {version}")
    transactional_id = reader.string()
    reader.expect_end()
    return transactional_id


def encode_value(value: TxnLogValue, version: int = 0) -> bytes:
    """Serialize `value`; Kafka writes version 0 unless transaction.version 2 is finalized."""
    if version not in VALUE_VERSIONS:
        raise ValueError(f"unsupported TransactionLogValue version {version}")
    if value.state is TxnState.EMPTY and value.partitions:
        raise ValueError("an Empty transaction cannot carry partitions")
    flexible = version >= 1
    out = bytearray(struct.pack(">hqhib", version, value.producer_id, value.producer_epoch,
                                value.timeout_ms, value.state.id))
    # Kafka writes a null partition list for Empty and groups partitions by topic otherwise.
    if value.state is TxnState.EMPTY:
        _write_array_length(out, None, flexible)
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(value.partitions):
            by_topic.setdefault(topic, []).append(partition)
        _write_array_length(out, len(by_topic), flexible)
        for topic, partitions in by_topic.items():
            _write_string(out, topic, flexible)
            _write_array_length(out, len(partitions), flexible)
            out += struct.pack(f">{len(partitions)}i", *partitions)
            if flexible:
                _write_tagged_fields(out, {})
    out += struct.pack(">qq", value.last_update_ms, value.start_ms)
    if flexible:
        tagged: dict[int, bytes] = {}
        if value.previous_producer_id != -1:
            tagged[_TAG_PREVIOUS_PRODUCER_ID] = struct.pack(">q", value.previous_producer_id)
        if value.next_producer_id != -1:
            tagged[_TAG_NEXT_PRODUCER_ID] = struct.pack(">q", value.next_producer_id)
        if value.client_transaction_version != 0:
            tagged[_TAG_CLIENT_TRANSACTION_VERSION] = struct.pack(">h", value.client_transaction_version)
        if value.next_producer_epoch != -1:
            tagged[_TAG_NEXT_PRODUCER_EPOCH] = struct.pack(">h", value.next_producer_epoch)
        _write_tagged_fields(out, tagged)
    return bytes(out)


def decode_value(data: bytes) -> TxnLogValue:
    reader = RecordReader(data)
    version = reader.int16()
    if version not in VALUE_VERSIONS:
        raise ValueError(f"unknown __transaction_state value version {version}")
    reader.flexible = version >= 1
    producer_id = reader.int64()
    producer_epoch = reader.int16()
    timeout_ms = reader.int32()
    state = TxnState.from_id(reader.int8())
    partitions: set[TopicPartition] = set()
    for _ in range(reader.nullable_array_length() or 0):
        topic = reader.string()
        for _ in range(reader.nullable_array_length() or 0):
            partitions.add((topic, reader.int32()))
        reader.tagged_fields()
    last_update_ms = reader.int64()
    start_ms = reader.int64()
    tagged = reader.tagged_fields()
    reader.expect_end()
    return TxnLogValue(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timeout_ms=timeout_ms,
        state=state,
        # Kafka ignores whatever partitions an Empty record might list.
        partitions=frozenset() if state is TxnState.EMPTY else frozenset(partitions),
        last_update_ms=last_update_ms,
        start_ms=start_ms,
        previous_producer_id=_tag_int(tagged, _TAG_PREVIOUS_PRODUCER_ID, ">q", -1),
        next_producer_id=_tag_int(tagged, _TAG_NEXT_PRODUCER_ID, ">q", -1),
        next_producer_epoch=_tag_int(tagged, _TAG_NEXT_PRODUCER_EPOCH, ">h", -1),
        client_transaction_version=_tag_int(tagged, _TAG_CLIENT_TRANSACTION_VERSION, ">h", 0),
    )


def decode_records(records: Iterable[tuple[bytes, bytes | None]]) -> dict[str, TxnLogValue]:
    """Replay a partition of the log: the last record of each id wins, tombstones remove it."""
    state: dict[str, TxnLogValue] = {}
    for key, value in records:
        try:
            transactional_id = decode_key(key)
        except UnknownKeyVersion:
            continue
        if value is None:
            state.pop(transactional_id, None)
        else:
            state[transactional_id] = decode_value(value)
    return state


def _tag_int(tagged: dict[int, bytes], tag: int, fmt: str, default: int) -> int:
    raw = tagged.get(tag)
    if raw is None:
        return default
    if len(raw) != struct.calcsize(fmt):
        raise ValueError(f"tagged field {tag} has {len(raw)} bytes")
    return struct.unpack(fmt, raw)[0]


def _write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _write_string(out: bytearray, text: str, flexible: bool) -> None:
    raw = text.encode("utf-8")
    if flexible:
        _write_uvarint(out, len(raw) + 1)
    else:
        out += struct.pack(">h", len(raw))
    out += raw


def _write_array_length(out: bytearray, length: int | None, flexible: bool) -> None:
    if flexible:
        _write_uvarint(out, 0 if length is None else length + 1)
    else:
        out += struct.pack(">i", -1 if length is None else length)


def _write_tagged_fields(out: bytearray, fields: dict[int, bytes]) -> None:
    _write_uvarint(out, len(fields))
    for tag in sorted(fields):
        _write_uvarint(out, tag)
        _write_uvarint(out, len(fields[tag]))
        out += fields[tag]


