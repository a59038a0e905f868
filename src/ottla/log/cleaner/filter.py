"""What the cleaner keeps of each batch: Kafka's LogCleaner record filter on raw v2 batches.

Batches are opaque bytes everywhere else; here the records of a batch are decoded (and
decompressed) so that superseded records, expired tombstones and aborted transactions can go.
A batch that loses nothing and needs no delete horizon is written back byte for byte; a
batch that changes is rebuilt with the same base offset, last offset delta, producer id,
epoch, base sequence and codec (Kafka's `buildRetainedRecordsInto` with
`overrideLastOffset`), so offsets never change and the producer's last sequence survives.

Tombstones and transaction markers follow KIP-534: the first clean that keeps them stamps the
batch with a delete horizon (attribute bit 6, the horizon stored as the base timestamp, the
record timestamp deltas rewritten against it); a later clean past the horizon drops them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

from ...records.batch import (
    COMPRESSION_MASK,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    compute_crc,
)
from ...records.compression import compress, decompress
from ...records.control import parse_control_batch
from ...records.records import decode_varint, encode_varint
from ..txn_index import AbortedTxn

__all__ = ["DELETE_HORIZON_BIT", "OffsetMap", "TxnTracker", "BatchFilter", "delete_horizon", "map_batch"]

DELETE_HORIZON_BIT = 0x40  # Kafka's DELETE_HORIZON_FLAG_MASK (KIP-534)
_MAP_ENTRY_BYTES = 24  # Kafka's SkimpyOffsetMap: a 16-byte MD5 of the key plus an 8-byte offset


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms), when a clean has stamped one."""
    return header.first_timestamp if header.attributes & DELETE_HORIZON_BIT else None


class OffsetMap:
    """Latest offset per key of the dirty section, sized as Kafka sizes its dedupe buffer:
    `memory` bytes at 24 bytes per key and a 0.9 load factor."""

    def __init__(self, memory: int, load_factor: float = 0.9):
        self.capacity = max(1, int(memory * load_factor) // _MAP_ENTRY_BYTES)
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._offsets)

    @staticmethod
    def _digest(key: bytes) -> bytes:
        """Keys shorter than a digest stand for themselves (they cannot collide with one)."""
        if len(key) < 16:
            return key
        return hashlib.md5(key, usedforsecurity=False).digest()

    def put(self, key: bytes, offset: int) -> None:
        self._offsets[key if len(key) < 16 else self._digest(key)] = offset  # _digest inline: the hot path
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        return self._offsets.get(key if len(key) < 16 else self._digest(key), -1)


@dataclass
class _AbortedInProgress:
    txn: AbortedTxn
    last_observed_batch_offset: int | None = None


@dataclass
class TxnTracker:
    """Kafka's CleanedTransactionMetadata: which batches belong to aborted transactions, and
    which markers may go. `aborted` comes from the transaction indexes of the cleaned range."""

    aborted: list[AbortedTxn]
    ongoing_committed: set[int] = field(default_factory=set)
    ongoing_aborted: dict[int, _AbortedInProgress] = field(default_factory=dict)
    kept_aborted: list[AbortedTxn] = field(default_factory=list)

    def __post_init__(self):
        self.aborted = sorted(self.aborted, key=lambda t: t.first_offset)
        self._next = 0

    def _consume_up_to(self, offset: int) -> None:
        while self._next < len(self.aborted) and self.aborted[self._next].first_offset <= offset:
            txn = self.aborted[self._next]
            self.ongoing_aborted[txn.producer_id] = _AbortedInProgress(txn)
            self._next += 1

    def on_data_batch(self, header: BatchHeader) -> bool:
        """True when the batch belongs to an aborted transaction (its records all go)."""
        self._consume_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        in_progress = self.ongoing_aborted.get(header.producer_id)
        if in_progress is not None:
            in_progress.last_observed_batch_offset = header.last_offset
            return True
        self.ongoing_committed.add(header.producer_id)
        return False

    def on_control_batch(self, header: BatchHeader, commit: bool | None) -> bool:
        """True when the marker may be discarded: no data of its transaction was seen in this
        pass (it was cleaned away earlier). An ABORT marker whose data was just removed stays
        for one more pass, with its index entry."""
        self._consume_up_to(header.last_offset)
        if commit is None:
            return False
        if not commit:
            in_progress = self.ongoing_aborted.pop(header.producer_id, None)
            if in_progress is not None and in_progress.last_observed_batch_offset is not None:
                self.kept_aborted.append(in_progress.txn)
                return False
            return True
        if header.producer_id in self.ongoing_committed:
            self.ongoing_committed.discard(header.producer_id)
            return False
        return True


class _Record(NamedTuple):
    offset_delta: int
    timestamp: int
    key: bytes | None
    has_value: bool
    attributes: int
    tail: memoryview  # key, value and headers, exactly as written


def _varint(data, position: int) -> tuple[int, int]:
    """decode_varint with the one- and two-byte cases inline: nearly every varint of a record
    is that short, and this loop is the cleaner's hot path."""
    byte = data[position]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), position + 1
    second = data[position + 1]
    if second < 0x80:
        raw = (byte & 0x7F) | (second << 7)
        return (raw >> 1) ^ -(raw & 1), position + 2
    return decode_varint(data, position)


def _records(data: bytes, header: BatchHeader) -> list[_Record]:
    """Each record's fields the cleaner needs, and its bytes from the key on."""
    records = []
    view = memoryview(data)
    position = 0
    first_timestamp = header.first_timestamp
    for _ in range(header.records_count):
        length, position = _varint(data, position)
        end = position + length
        attributes = data[position]
        timestamp_delta, cursor = _varint(data, position + 1)
        offset_delta, cursor = _varint(data, cursor)
        tail_start = cursor
        key_length, cursor = _varint(data, cursor)
        key = None
        if key_length >= 0:
            key = data[cursor:cursor + key_length]
            cursor += key_length
        value_length = _varint(data, cursor)[0]
        records.append(_Record(offset_delta, first_timestamp + timestamp_delta, key, value_length >= 0,
                               attributes, view[tail_start:end]))
        position = end
    return records


def _body(chunk, header: BatchHeader) -> bytes:
    return decompress(header.compression, memoryview(chunk)[header.position + HEADER_SIZE:header.position + header.size])


def _batch_records(chunk, header: BatchHeader) -> list[_Record]:
    return _records(_body(chunk, header), header)


def _kept(body, header: BatchHeader, survivors: list[int]) -> list[_Record]:
    """The records at the indexes in `survivors`, decoded."""
    if not survivors:
        return []
    records = _records(body, header)
    return [records[i] for i in survivors]


def _keys(data, header: BatchHeader) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, has a value) of each record: all that deciding what survives needs, read
    without building a record. The usual varints (one byte; two for a record length) are
    decoded inline."""
    out = []
    append = out.append
    base = header.base_offset
    position = 0
    for _ in range(header.records_count):
        byte = data[position]
        if byte < 0x80:
            cursor = position + 1
            end = cursor + ((byte >> 1) ^ -(byte & 1))
        elif data[position + 1] < 0x80:  # records of 64 to 8,191 bytes
            raw = (byte & 0x7F) | (data[position + 1] << 7)
            cursor = position + 2
            end = cursor + ((raw >> 1) ^ -(raw & 1))
        else:
            length, cursor = _varint(data, position)
            end = cursor + length
        cursor += 1  # the attributes
        if data[cursor] >= 0x80:  # timestamp delta, not needed
            cursor = _varint(data, cursor)[1]
        else:
            cursor += 1
        byte = data[cursor]
        if byte < 0x80:
            offset_delta = (byte >> 1) ^ -(byte & 1)
            cursor += 1
        else:
            offset_delta, cursor = _varint(data, cursor)
        byte = data[cursor]
        if byte < 0x80:
            key_length = (byte >> 1) ^ -(byte & 1)
            cursor += 1
        else:
            key_length, cursor = _varint(data, cursor)
        if key_length >= 0:
            key = data[cursor:cursor + key_length]
            cursor += key_length
        else:
            key = None
        append((base + offset_delta, key, data[cursor] != 1))  # a value length of -1 is the byte 1
        position = end
    return out


def map_batch(chunk, header: BatchHeader, offset_map: OffsetMap) -> None:
    """Put every keyed record of a data batch into the offset map (only keys are decoded)."""
    put = offset_map.put
    for offset, key, _ in _keys(_body(chunk, header), header):
        if key is not None:
            put(key, offset)


def _build(header: BatchHeader, records: list[_Record], base_timestamp: int, horizon_set: bool) -> bytes:
    """The batch again with only `records`; an empty batch keeps its producer metadata."""
    body = bytearray()
    for record in records:
        inner = bytearray((record.attributes,))
        encode_varint(record.timestamp - base_timestamp, inner)
        encode_varint(record.offset_delta, inner)
        inner += record.tail
        encode_varint(len(inner), body)
        body += inner
    attributes = header.attributes | (DELETE_HORIZON_BIT if horizon_set else 0)
    if records:
        body = compress(header.compression, bytes(body))
    else:
        attributes &= ~COMPRESSION_MASK  # Kafka writes empty batches uncompressed
    if header.attributes & TIMESTAMP_TYPE_BIT or not records:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in records)
    size = HEADER_SIZE + len(body)
    buf = bytearray(size)
    HEADER.pack_into(buf, 0, header.base_offset, size - LOG_OVERHEAD, header.partition_leader_epoch, 2, 0,
                     attributes, header.last_offset_delta, base_timestamp, max_timestamp, header.producer_id,
                     header.producer_epoch, header.base_sequence, len(records))
    buf[HEADER_SIZE:] = body
    buf[17:CRC_START] = compute_crc(buf, 0, size).to_bytes(4, "big")
    return bytes(buf)


@dataclass
class BatchFilter:
    """Decides, batch by batch, what a clean keeps (Kafka's LogCleaner.cleanInto filter).

    `last_batches` maps each live producer id to the last offset of its latest data batch
    (or of its latest marker, for a producer that only wrote markers): that batch is kept,
    emptied if need be, so the producer's sequence and epoch survive.
    """

    offset_map: OffsetMap
    txns: TxnTracker
    now_ms: int
    delete_retention_ms: int
    last_batches: dict[int, int]
    records_read: int = 0
    records_kept: int = 0
    earliest_horizon: int | None = None

    def _note_horizon(self, horizon: int) -> None:
        """Remember the earliest horizon still ahead: the log is due for a clean once it passes."""
        if horizon <= self.now_ms:
            return
        if self.earliest_horizon is None or horizon < self.earliest_horizon:
            self.earliest_horizon = horizon

    def _is_producer_last(self, header: BatchHeader) -> bool:
        return header.has_producer_id and self.last_batches.get(header.producer_id) == header.last_offset

    def apply(self, chunk, header: BatchHeader) -> bytes | memoryview | None:
        """The bytes to write for this batch (the original when unchanged), or None to drop it."""
        original = memoryview(chunk)[header.position:header.position + header.size]
        horizon = delete_horizon(header)
        if header.is_control:
            marker = parse_control_batch(chunk, header)
            can_discard = self.txns.on_control_batch(header, None if marker is None else marker.commit)
            if can_discard and horizon is not None and self.now_ms >= horizon and not self._is_producer_last(header):
                return None
            if can_discard and horizon is None:
                horizon = self.now_ms + self.delete_retention_ms
                self._note_horizon(horizon)
                return _build(header, _batch_records(chunk, header), horizon, True)
            if horizon is not None:
                self._note_horizon(horizon)
            return original
        aborted = self.txns.on_data_batch(header)
        self.records_read += header.records_count
        retain_deletes = horizon is None or self.now_ms < horizon
        # What survives is decided from keys and offsets alone (`_keys`); records are decoded
        # only for a batch rebuilt with some of them.
        body = None if aborted else _body(chunk, header)
        entries = [] if aborted else _keys(body, header)
        latest = self.offset_map.get
        survivors = [i for i, (offset, key, has_value) in enumerate(entries)
                     if key is not None and offset >= latest(key) and (has_value or retain_deletes)]
        self.records_kept += len(survivors)
        if any(not entries[i][2] for i in survivors):  # tombstones kept
            if horizon is None:
                horizon = self.now_ms + self.delete_retention_ms
                self._note_horizon(horizon)
                return _build(header, _kept(body, header, survivors), horizon, True)
            self._note_horizon(horizon)
        if not survivors:  # an emptied batch stays only to carry its producer's last sequence
            if not self._is_producer_last(header):
                return None
            if header.records_count == 0:
                return original
        elif len(survivors) == header.records_count:
            return original
        kept = _kept(body, header, survivors)
        if horizon is not None:
            return _build(header, kept, horizon, True)
        return _build(header, kept, header.first_timestamp, False)
