"""Hostile record batches inside otherwise valid Produce requests (issue 11, F5/F6).

`mutate` damages the inside of a valid batch -- record bytes, the record count, the batch
length, one record's length, a compressed payload, the CRC -- and, unless the CRC is the
damage, makes the CRC valid again, so only a walk of the records as Kafka's LogValidator
does can tell. Every mutation here yields a batch Kafka refuses, so the only right answer
is CORRUPT_MESSAGE or INVALID_RECORD for the partition (and the connection keeps working);
a batch declaring more bytes than `max.message.bytes` may also be MESSAGE_TOO_LARGE.
"""

from __future__ import annotations

import random
import struct
from datetime import timedelta

from ..errors import ErrorCode
from ..records.batch import CRC_OFFSET, HEADER_SIZE, compute_crc

__all__ = ["MUTATIONS", "refused", "valid_batches", "mutate", "produce_request", "partition_error"]

MUTATIONS = ("crc", "garbage_records", "count_over", "count_under", "length_over", "length_under",
             "truncate", "record_length")
_REFUSED = frozenset({ErrorCode.corrupt_message, ErrorCode.invalid_record})


def refused(kind: str) -> frozenset[ErrorCode]:
    """The answers Kafka may give a batch damaged by `kind`."""
    return _REFUSED | {ErrorCode.message_too_large} if kind == "length_over" else _REFUSED

_LENGTH = struct.Struct(">i")
_LENGTH_AT = 8  # the batch length field: the bytes after it
_COUNT_AT = 57  # records count, the header's last field
_ATTRIBUTES_AT = 21


def valid_batches() -> tuple[bytes, ...]:
    """Plain and compressed batches of a few records, without producer ids (no sequence checks)."""
    from ..records.records import Record, build_batch
    records = [Record(key=b"k%d" % i, value=b"v" * (i * 7 + 1)) for i in range(5)]
    return (build_batch(records), build_batch(records[:1]), build_batch(records, compression="gzip"),
            build_batch(records, compression="zstd"))


def _zigzag_byte(value: int) -> int:
    """A one-byte zigzag varint (0 <= value <= 63)."""
    return value << 1


def mutate(batch: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One damaged copy of a valid batch and the name of the damage."""
    data = bytearray(batch)
    compressed = struct.unpack_from(">h", data, _ATTRIBUTES_AT)[0] & 0x7
    count = _LENGTH.unpack_from(data, _COUNT_AT)[0]
    kind = rng.choice(MUTATIONS)
    if kind == "record_length" and compressed:
        kind = "garbage_records"  # a compressed payload's record lengths are not at hand
    if kind == "crc":
        # In the records: a flipped header field (attributes, producer id) may be refused
        # earlier with its own error, as Kafka checks those before the CRC.
        position = rng.randrange(HEADER_SIZE, len(data))
        data[position] ^= 1 << rng.randrange(8)
    elif kind == "garbage_records":
        # 0xff bytes: a varint that never ends, in plain records and in any codec's framing
        data[HEADER_SIZE:] = b"\xff" * max(1, len(data) - HEADER_SIZE + rng.randrange(-4, 5))
    elif kind == "count_over":
        _LENGTH.pack_into(data, _COUNT_AT, rng.choice((count + 1, count + 1000, 0x7FFFFFFF)))
    elif kind == "count_under":
        _LENGTH.pack_into(data, _COUNT_AT, rng.choice((count - 1, 0, -1)))
    elif kind == "truncate":
        del data[rng.randrange(HEADER_SIZE, len(data)):]
    elif kind == "record_length":
        declared = data[HEADER_SIZE] >> 1  # the first record's length (small records: one byte)
        data[HEADER_SIZE] = _zigzag_byte(declared + 1 if declared < 63 else declared - 1)
    if kind == "length_over":
        _LENGTH.pack_into(data, _LENGTH_AT, len(data) - 12 + rng.choice((1, 7, 1 << 20)))
    elif kind == "length_under":
        actual = len(data) - 12
        _LENGTH.pack_into(data, _LENGTH_AT, rng.choice((actual - 1, actual - 7, HEADER_SIZE - 12 - 1)))
    else:
        _LENGTH.pack_into(data, _LENGTH_AT, len(data) - 12)
    if kind != "crc":
        struct.pack_into(">I", data, CRC_OFFSET, compute_crc(data, 0, len(data)))
    return kind, bytes(data)


def produce_request(records: bytes, version: int, topic: str):
    """A Produce request (v3 or v9) of one partition, acks=1."""
    if version >= 9:
        from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    else:
        from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
    return ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=30), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=records),)),))


def partition_error(frame: bytes, version: int) -> ErrorCode:
    """The partition's error code in a Produce response frame (without its size prefix)."""
    from ..protocol.codec import decode_response
    _, response = decode_response(frame, 0, version)
    return ErrorCode(response.responses[0].partition_responses[0].error_code)
