"""The batch codecs Kafka defines (attributes bits 0-2), all through cramjam.

Only the slow paths use these: decoding records for the CLI and internal topics, and
recompressing when a topic's `compression.type` differs from what the producer sent.
"""

from __future__ import annotations

import mmap
import struct

import cramjam

from ..errors import ErrorCode, KafkaError

__all__ = ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "CODEC_IDS", "compress", "decompress", "decompress_bounded"]

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


_INTO = {GZIP: cramjam.gzip.decompress_into, LZ4: cramjam.lz4.decompress_into, ZSTD: cramjam.zstd.decompress_into}
_FIRST_GUESS = 64 * 1024
# Output buffers from this size on are anonymous mappings (`_output_buffer`).
_MAPPED_FROM = 1 << 20
# How cramjam's decompress_into says the output buffer is full (tests/unit/test_record_validator.py pins it).
_OUTPUT_FULL = "failed to write whole buffer"


def _output_buffer(size: int):
    """A writable buffer of `size` zero bytes. bytearray(size) writes its zeros holding the
    GIL: doubling up to a bomb's 256 MiB bound that way held the event loop 100-400 ms from a
    worker thread. A large one is an anonymous mapping instead, whose pages the kernel zeroes
    as the codec first writes them, with the GIL released."""
    return bytearray(size) if size < _MAPPED_FROM else mmap.mmap(-1, size)


def decompress_bounded(codec: int, data, limit: int) -> bytearray | bytes | memoryview:
    """`decompress`, but never inflating more than `limit` bytes: over it is MESSAGE_TOO_LARGE.

    cramjam's stream decompressors want the whole input at once, so instead the output goes
    into a buffer of a fixed size (`decompress_into` stops when it is full), starting from a
    guess and doubling up to `limit`: a bomb costs at most about twice `limit` of work and
    `limit` of memory. Snappy states its inflated size up front, so it is checked first.
    """
    into = _INTO.get(codec)
    if into is None:
        if codec != SNAPPY:
            return decompress(codec, data)
        try:
            return _snappy_decompress(data, limit)
        except (cramjam.DecompressionError, ValueError, struct.error) as exc:
            raise KafkaError(ErrorCode.corrupt_message, f"cannot decompress batch: {exc}") from None
    size = min(limit, max(_FIRST_GUESS, 4 * len(data)))
    while True:
        out = None  # the smaller buffer goes before the bigger one comes
        out = _output_buffer(size)
        try:
            written = into(data, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise KafkaError(ErrorCode.corrupt_message, f"cannot decompress batch: {exc}") from None
            if size >= limit:
                # Freed here, not by whoever collects the frame this exception's traceback holds:
                # unmapping 256 MiB took a collection on the event loop 0.45 s of CPU.
                out = None
                raise KafkaError(ErrorCode.message_too_large, f"batch inflates to more than {limit} bytes") from None
            size = min(limit, size * 2)
            continue
        if isinstance(out, bytearray):
            del out[written:]
            return out
        return memoryview(out)[:written]


def _snappy_decompress(data, limit: int | None = None) -> bytes:
    view = memoryview(data)
    if bytes(view[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        _check_snappy_size(view, limit)
        return bytes(cramjam.snappy.decompress_raw(view))
    chunks = []
    total = 0
    position = _XERIAL_HEADER_SIZE
    while position < len(view):
        (length,) = _I32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > len(view):
            raise ValueError("truncated xerial snappy block")
        block = view[position : position + length]
        total += _check_snappy_size(block, None if limit is None else limit - total)
        chunks.append(bytes(cramjam.snappy.decompress_raw(block)))
        position += length
    return b"".join(chunks)


def _check_snappy_size(block, limit: int | None) -> int:
    size = cramjam.snappy.decompress_raw_len(block)
    if limit is not None and size > limit:
        raise KafkaError(ErrorCode.message_too_large, "batch inflates to more than the limit")
    return size
