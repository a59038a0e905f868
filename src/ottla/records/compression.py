"""The batch codecs Kafka defines (attributes bits 0-2), all through cramjam.

Only the slow paths use these: decoding records for the CLI and internal topics, and
recompressing when a topic's `compression.type` differs from what the producer sent.
"""

from __future__ import annotations

import struct

import cramjam

from ..errors import ErrorCode, KafkaError

__all__ = ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "CODEC_IDS", "compress", "decompress"]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4

# Topic-config names to codec ids; "producer" means keep whatever the batch has.
CODEC_IDS = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

# The Java client wraps snappy in xerial's stream framing: this magic, two version ints,
# then blocks of (i32 compressed length, raw snappy block).
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_I32 = struct.Struct(">i")


def compress(codec: int, data: bytes) -> bytes:
    """Encode with the codec's Kafka wire format (raw snappy, LZ4 frame, zstd frame, gzip)."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise KafkaError(ErrorCode.unsupported_compression_type, f"unknown compression codec {codec}")


def decompress(codec: int, data) -> bytes:
    """Decode a batch's records section; a malformed stream is CORRUPT_MESSAGE."""
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (cramjam.DecompressionError, ValueError, struct.error) as exc:
        raise KafkaError(ErrorCode.corrupt_message, f"cannot decompress batch: {exc}") from None
    raise KafkaError(ErrorCode.unsupported_compression_type, f"unknown compression codec {codec}")


def _snappy_decompress(data) -> bytes:
    view = memoryview(data)
    if bytes(view[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    chunks = []
    position = _XERIAL_HEADER_SIZE
    while position < len(view):
        (length,) = _I32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > len(view):
            raise ValueError("truncated xerial snappy block")
        chunks.append(bytes(cramjam.snappy.decompress_raw(view[position : position + length])))
        position += length
    return b"".join(chunks)
