"""The sans-I/O codec: framing and request decoding without sockets."""

import datetime
import io
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer

from ottla.protocol.codec import (
    FrameDecoder,
    FrameTooLarge,
    MalformedRequest,
    UnknownApi,
    ProtocolViolation,
    UnsupportedApiVersion,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    response_correlation_id,
    response_schema,
)
from ottla.protocol.build import make

SUPPORTED = {18: (0, 4), 3: (0, 12)}


def _frame(request, api_key, version, correlation_id=7):
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=api_key, request_api_version=version,
                                                    correlation_id=correlation_id, client_id="test"))
    entity_writer(type(request))(out, request)
    return out.getvalue()


def test_decoder_splits_frames_across_arbitrary_chunks():
    payloads = [b"a" * 10, b"", b"b" * 3000, b"c"]
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    decoder = FrameDecoder(1 << 20)
    frames = []
    for i in range(0, len(stream), 7):
        frames += decoder.feed(stream[i:i + 7])
    assert frames == payloads
    assert decoder.buffered == 0


def test_decoder_rejects_negative_and_oversized_sizes():
    with pytest.raises(MalformedRequest):
        FrameDecoder(100).feed(struct.pack(">i", -5))
    with pytest.raises(FrameTooLarge):
        FrameDecoder(100).feed(struct.pack(">i", 101))
    assert FrameDecoder(100).feed(struct.pack(">i", 100)) == []  # waits for the body


def test_decode_flexible_request_roundtrip():
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name="orders"),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    decoded = decode_request(_frame(request, 3, 12), SUPPORTED)
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (3, 12, 7)
    assert decoded.body == request
    assert decoded.header.client_id == "test"


def test_unknown_api_and_unsupported_version():
    request = ApiVersionsRequest(client_software_name="x", client_software_version="1")
    with pytest.raises(UnknownApi):
        decode_request(_frame(request, 18, 3), {3: (0, 12)})
    with pytest.raises(UnsupportedApiVersion) as info:
        decode_request(_frame(request, 18, 3), {18: (0, 2)})
    assert info.value.correlation_id == 7


def test_truncated_body_is_malformed_and_trailing_bytes_are_ignored():
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name="orders"),),
                              allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    frame = _frame(request, 3, 12)
    with pytest.raises(MalformedRequest):
        decode_request(frame[:-3], SUPPORTED)
    with pytest.raises(MalformedRequest):
        decode_request(b"\x00\x03", SUPPORTED)
    # Kafka's broker ignores bytes after the body, and librdkafka relies on it.
    assert decode_request(frame + b"\x01\x00\x00", SUPPORTED).body == request


def test_encode_response_uses_header_v0_for_api_versions():
    from kio.schema.api_versions.v3.response import ApiVersionsResponse
    from kio.schema.errors import ErrorCode
    import datetime

    response = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=(), throttle_time=datetime.timedelta(0))
    frame = b"".join(encode_response(18, 3, 42, response))
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 42
    body, body_size = entity_reader(ApiVersionsResponse)(frame, 8)  # header v0: no tagged fields
    assert body == response and 8 + body_size == len(frame)


def test_decoder_receives_large_frames_into_their_own_buffer():
    big = bytes(range(256)) * 4096  # 1 MiB, larger than the staging buffer
    small = b"tail"
    stream = struct.pack(">i", len(big)) + big + struct.pack(">i", len(small)) + small
    decoder = FrameDecoder(2 << 20, staging_bytes=64 * 1024)
    frames, offset = [], 0
    while offset < len(stream):
        target = decoder.get_buffer()
        count = min(len(target), 10_000, len(stream) - offset)
        target[:count] = stream[offset:offset + count]
        offset += count
        frames += decoder.buffer_updated(count)
    assert [bytes(f) for f in frames] == [big, small]
    assert decoder.buffered == 0


def test_decoders_hold_no_buffer_between_whole_frames_nor_for_the_read_that_finds_eof():
    """5,200 connections closing at once took 1.4 GB: asyncio asks each for a buffer before the
    read that finds EOF, and each made its 256 KiB staging buffer for it (issue 11, load test).
    Reads go to one scratch buffer now; only an incomplete frame gets a buffer of its own."""
    import tracemalloc

    frame = struct.pack(">i", 3) + b"abc"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoders = [FrameDecoder(1 << 20) for _ in range(200)]
        for decoder in decoders:
            assert [bytes(f) for f in decoder.feed(frame * 2)] == [b"abc", b"abc"]
            decoder.get_buffer()  # the read that finds EOF: recv_into returns 0, nothing more
        held = tracemalloc.get_traced_memory()[0] - before
        assert held < 1 << 20, f"200 decoders hold {held >> 10} KiB"
        # Half a frame needs a buffer of its own until the rest arrives; then it goes again.
        assert decoders[0].feed(frame[:5]) == []
        assert tracemalloc.get_traced_memory()[0] - before >= 256 * 1024
        assert [bytes(f) for f in decoders[0].feed(frame[5:])] == [b"abc"]
        assert tracemalloc.get_traced_memory()[0] - before < 1 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("version", [4, 12])
def test_encode_response_keeps_fetched_records_by_reference(version):
    """A fetch response's record batches become chunks of their own, not copies in one buffer,
    and the chunks concatenate to the frame kio itself encodes."""
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.serial import entity_writer

    from ottla.protocol.build import make, nested
    from ottla.protocol.codec import response_schema

    response_type = response_schema(1, version)
    partition_type = nested(response_type, "PartitionData")
    topic_type = nested(response_type, "FetchableTopicResponse")
    big, small = bytes(range(256)) * 256, b"tiny batch"  # 64 KiB, and one under the threshold
    partitions = tuple(
        make(partition_type, partition_index=i, error_code=ErrorCode.none, high_watermark=10, last_stable_offset=10,
             log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=records)
        for i, records in enumerate([big, small, big])
    )
    response = make(response_type, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                    responses=(make(topic_type, topic="t", partitions=partitions),))
    chunks = encode_response(1, version, 7, response)
    assert [chunk for chunk in chunks if chunk is big] == [big, big]
    frame = b"".join(chunks)
    expected = io.BytesIO()
    header_schema = response_type.__header_schema__
    entity_writer(header_schema)(expected, header_schema(correlation_id=7))
    entity_writer(response_type)(expected, response)
    assert frame[4:] == expected.getvalue()
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4


def test_client_side_round_trip():
    """encode_request is what decode_request reads; decode_response reads what encode_response wrote."""
    request = MetadataRequest(topics=(MetadataRequestTopic(name="a", topic_id=None),), allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    frame = encode_request(request, 77, "broker-3")
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    decoded = decode_request(frame[4:], {3: (0, 12)})
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (3, 12, 77)
    assert decoded.header.client_id == "broker-3" and decoded.body == request
    response_type = response_schema(3, 12)
    response = make(response_type, throttle_time=datetime.timedelta(0), brokers=(), cluster_id="c", controller_id=1, topics=(),
                    cluster_authorized_operations=-2147483648)
    out = b"".join(bytes(c) for c in encode_response(3, 12, 77, response))[4:]
    assert response_correlation_id(out) == 77
    assert decode_response(out, 3, 12) == (77, response)
    with pytest.raises(ProtocolViolation):
        decode_response(out[:9], 3, 12)
