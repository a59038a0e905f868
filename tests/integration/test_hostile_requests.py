"""Requests that lie about their own structure (issue 11, F1 and F4), with the exact bytes found.

Each must get an answer or a closed connection with one log line, never a dead broker or a
connection left open and silent.
"""

import io
import resource
import socket
import struct
import zlib
from datetime import timedelta

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_topics.v5.request import CreateTopicsRequest
from kio.schema.describe_configs.v1.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from ottla.protocol.schemas import request_schema

from tests.wire import decode_response, encode_request, is_closed, read_frame, roundtrip

# 8 GiB of address space: plenty for the broker, far less than what a lying count asked for.
_ADDRESS_SPACE = 8 << 30


@pytest.fixture
def limited_broker(ottla_broker):
    resource.prlimit(ottla_broker.pid, resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))
    return ottla_broker


def _alive(broker, raw_connection) -> bool:
    if not broker.running():
        return False
    sock = raw_connection(broker.bootstrap)
    _, response = roundtrip(sock, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    return response.error_code == ErrorCode.none


def _send_raw(raw_connection, broker, hex_frame: str) -> socket.socket:
    sock = raw_connection(broker.bootstrap)
    sock.sendall(bytes.fromhex(hex_frame))
    return sock


@pytest.mark.parametrize("hex_frame, field", [
    # Metadata v9, compact topics array count 2^32-2 (kio reserved 32 GiB and aborted)
    ("000000100003000900000001ffff00ffffffff0f", "MetadataRequest.topics"),
    # Metadata v1, legacy topics array count 2^31-1 (16 GiB; dies under a memory limit)
    ("0000000e0003000100000001ffff7fffffff", "MetadataRequest.topics"),
], ids=["compact-count", "legacy-count"])
def test_lying_array_count_closes_the_connection(limited_broker, raw_connection, hex_frame, field):
    sock = _send_raw(raw_connection, limited_broker, hex_frame)
    assert is_closed(sock)
    assert _alive(limited_broker, raw_connection)
    log = limited_broker.read_stderr()
    lines = [line for line in log.splitlines() if field in line]
    assert len(lines) == 1, log
    assert "cannot parse Metadata v" in lines[0] and "cannot fit" in lines[0]


def test_metadata_v10_with_a_null_topic_name_is_answered_invalid_request(ottla_broker, raw_connection):
    # Metadata v10 naming one topic with a null name (v10 and v11 may not use topic ids): Kafka
    # answers INVALID_REQUEST for that topic, with "" for the name.
    sock = _send_raw(raw_connection, ottla_broker,
                     "000000260003000a02006e44000466757a7a000200000000000000000000000000000000000000000000")
    sock.settimeout(10)
    correlation_id, response = decode_response(read_frame(sock), 3, 10)
    assert correlation_id == 0x02006E44
    assert [(t.name, t.error_code) for t in response.topics] == [("", ErrorCode.invalid_request)]
    assert _alive(ottla_broker, raw_connection)


def _null_first_array(request) -> bytes:
    """`request` (whose first field is an empty array) with that array sent as null."""
    frame = bytearray(encode_request(request))
    body = 4 + len(encode_request(request)) - 4 - _body_size(request)
    empty, null = (b"\x01", b"\x00") if type(request).__flexible__ else (b"\x00\x00\x00\x00", b"\xff\xff\xff\xff")
    assert frame[body:body + len(empty)] == empty
    frame[body:body + len(empty)] = null
    return bytes(frame)


def _body_size(request) -> int:
    out = io.BytesIO()
    entity_writer(type(request))(out, request)
    return len(out.getvalue())


@pytest.mark.parametrize("request_, field", [
    (CreateTopicsRequest(topics=(), timeout=timedelta(seconds=1), validate_only=False), "CreateTopicsRequest.topics"),
    (DescribeConfigsRequest(resources=(), include_synonyms=False), "DescribeConfigsRequest.resources"),
], ids=["compact-null-array", "legacy-null-array"])
def test_null_for_a_non_nullable_array_is_refused_at_decoding(ottla_broker, raw_connection, request_, field):
    sock = raw_connection(ottla_broker.bootstrap)
    sock.sendall(_null_first_array(request_))
    assert is_closed(sock)
    assert _alive(ottla_broker, raw_connection)
    log = ottla_broker.read_stderr()
    lines = [line for line in log.splitlines() if field in line]
    assert len(lines) == 1 and "null where an array is required" in lines[0], log
    assert "Traceback" not in log


def test_a_response_that_cannot_be_encoded_closes_the_connection(ottla_broker, raw_connection):
    # DescribeConfigs echoes the topic name in its error message: a 32,767-byte name makes a
    # message longer than a STRING can hold. The client must not wait forever for an answer.
    sock = raw_connection(ottla_broker.bootstrap)
    sock.sendall(encode_request(DescribeConfigsRequest(resources=(DescribeConfigsResource(
        resource_type=2, resource_name="x" * 32767, configuration_keys=None),), include_synonyms=False)))
    assert is_closed(sock)
    assert _alive(ottla_broker, raw_connection)
    lines = [line for line in ottla_broker.read_stderr().splitlines() if "cannot encode" in line]
    assert len(lines) == 1 and "DescribeConfigs v1 response" in lines[0], ottla_broker.read_stderr()


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmHWM"))


def test_a_legacy_compressed_message_set_inflates_no_further_than_a_v2_batch(ottla_broker, raw_connection):
    # Produce v2 carries message format v1: a gzip wrapper message of about 1 MB whose value
    # inflates to 1 GiB. It was up-converted by inflating it whole (2.1 GB of RSS; a 100 MB
    # request could ask for 100 GB); now it is held to the v2 batch's bound and refused.
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    inner = b"".join(deflate.compress(bytes(1 << 20)) for _ in range(1024)) + deflate.flush()
    body = struct.pack(">bbq", 1, 1, 0) + struct.pack(">i", -1) + struct.pack(">i", len(inner)) + inner
    wrapper = struct.pack(">I", zlib.crc32(body)) + body
    message_set = struct.pack(">qi", 0, len(wrapper)) + wrapper
    produce = request_schema(0, 2)
    topic_type = produce.__dataclass_fields__["topic_data"].type.__args__[0]
    partition_type = topic_type.__dataclass_fields__["partition_data"].type.__args__[0]
    request = produce(acks=1, timeout=timedelta(seconds=30), topic_data=(topic_type(
        name="bombed", partition_data=(partition_type(index=0, records=message_set),)),))
    sock = raw_connection(ottla_broker.bootstrap)
    sock.settimeout(120)
    _, response = roundtrip(sock, request)
    (partition,) = response.responses[0].partition_responses
    assert partition.error_code == ErrorCode.message_too_large
    assert _peak_rss(ottla_broker.pid) < 256 << 20
    assert _alive(ottla_broker, raw_connection)
