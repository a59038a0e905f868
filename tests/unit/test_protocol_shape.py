"""The pre-check of lengths and counts (protocol/shape.py) and codec properties, with Hypothesis.

The pre-check must follow exactly the structure kio reads: for every valid request of every
API and version the broker serves it ends where kio ends, and whenever it accepts a damaged
frame kio reads that frame to the same end (so kio never meets a count that was not checked).
"""

import random
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ottla.protocol.codec import FrameDecoder, _request_codec, decode_request
from ottla.protocol.errors import MalformedRequest
from ottla.protocol.shape import UnknownTaggedFields, check_request, produce_entries, strip_unknown_tagged_fields
from ottla.protocol.shape import uvarint_bytes as _uvarint
from ottla.server.handlers import load_handlers
from ottla.testing.fuzz import RequestFactory, encode, mutate

HANDLERS = load_handlers()
SUPPORTED = {key: (h.min_version, h.max_version) for key, h in HANDLERS.items()}
API_VERSIONS = sorted((key, version) for key, (low, high) in SUPPORTED.items() for version in range(low, high + 1))


def _kio_end(frame, api_key, version) -> int:
    _, read_header, read_body = _request_codec(api_key, version)
    _, header_size = read_header(frame, 0)
    _, body_size = read_body(frame, header_size)
    return header_size + body_size


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(API_VERSIONS), seed=st.integers(0, 2**32))
def test_valid_requests_end_where_kio_ends(api, seed):
    api_key, version = api
    frame = encode(RequestFactory(random.Random(seed)).request(api_key, version), 1)[4:]
    assert check_request(frame, api_key, version) == _kio_end(frame, api_key, version) == len(frame)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(API_VERSIONS), seed=st.integers(0, 2**32))
def test_an_accepted_damaged_frame_is_read_by_kio_to_the_same_end(api, seed):
    api_key, version = api
    rng = random.Random(seed)
    _, damaged = mutate(encode(RequestFactory(rng).request(api_key, version), 1), rng)
    frame = damaged[4:]
    try:
        end = check_request(frame, api_key, version)
    except MalformedRequest:
        return
    except UnknownTaggedFields:  # kio reads the frame without them to where the check ends
        try:
            frame = strip_unknown_tagged_fields(frame, api_key, version)
        except MalformedRequest:
            return
        end = check_request(frame, api_key, version)
    try:
        kio_end = _kio_end(frame, api_key, version)
    except Exception:  # a value kio refuses (bad UTF-8, a boolean of 7): refused either way
        return
    assert end == kio_end


@pytest.mark.parametrize("hex_frame", [
    "0003000900000001ffff00ffffffff0f",  # Metadata v9, compact count 2^32-2
    "0003000100000001ffff7fffffff",  # Metadata v1, legacy count 2^31-1
])
def test_counts_that_cannot_fit_are_refused(hex_frame):
    with pytest.raises(MalformedRequest, match="cannot fit"):
        decode_request(bytes.fromhex(hex_frame), SUPPORTED)


def test_nested_counts_are_bounded_by_the_bytes_left_at_their_position():
    # Produce v3: one topic "t" whose partition array claims 1,000 partitions in 30 bytes.
    frame = bytes.fromhex("0000000300000001ffff" "ffff" "ffff" "00001388" "00000001" "000174" "000003e8") + bytes(30)
    with pytest.raises(MalformedRequest, match=r"partition_data: count 1000 cannot fit in the 30 bytes left"):
        check_request(frame, 0, 3)


def test_lengths_past_the_end_and_nulls_where_values_are_required():
    header = bytes.fromhex("0003000100000001ffff")  # Metadata v1, null client id
    with pytest.raises(MalformedRequest, match="length 200 exceeds"):
        check_request(header + bytes.fromhex("00000001" "00c8") + b"abc", 3, 1)
    with pytest.raises(MalformedRequest, match="null where a value is required"):
        check_request(header + bytes.fromhex("00000001" "ffff"), 3, 1)
    assert check_request(header + bytes.fromhex("ffffffff"), 3, 1) == 14  # null topics: all topics


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=8), cuts=st.lists(st.integers(1, 5000), max_size=20),
       staging=st.sampled_from([64, 1024, 256 * 1024]))
def test_frame_decoder_gives_the_same_frames_wherever_the_stream_is_split(sizes, cuts, staging):
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    stream = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
    decoder = FrameDecoder(1 << 20, staging_bytes=staging)
    frames, position = [], 0
    for cut in cuts + [len(stream)]:
        frames += [bytes(f) for f in decoder.feed(stream[position:position + cut])]
        position = min(len(stream), position + cut)
    assert frames == payloads
    assert decoder.buffered == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(API_VERSIONS), seed=st.integers(0, 2**32))
def test_decode_of_encode_round_trips(api, seed):
    api_key, version = api
    request = RequestFactory(random.Random(seed)).request(api_key, version)
    decoded = decode_request(encode(request, 77)[4:], SUPPORTED)
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (api_key, version, 77)
    assert decoded.body == request


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from([v for key, v in API_VERSIONS if key == 0]), seed=st.integers(0, 2**32),
       limit=st.integers(1, 80))
def test_produce_entries_counts_topics_and_partitions_up_to_the_limit(version, seed, limit):
    """The few-step walk that decides where a Produce is decoded counts what kio reads."""
    request = RequestFactory(random.Random(seed)).request(0, version)
    entries = len(request.topic_data) + sum(len(topic.partition_data) for topic in request.topic_data)
    assert produce_entries(encode(request, 1)[4:], version, limit) == min(entries, limit)


FLEXIBLE = [(key, version) for key, version in API_VERSIONS
            if type(RequestFactory(random.Random(0)).request(key, version)).__flexible__]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=st.sampled_from(FLEXIBLE), seed=st.integers(0, 2**32), tags=st.lists(
    st.tuples(st.integers(0, 2**20), st.binary(max_size=40)), min_size=1, max_size=4))
def test_unknown_tagged_fields_in_a_request_header_are_skipped_as_kafka_skips_them(api, seed, tags):
    """KIP-482: a newer client may send tags an older broker does not know; Kafka skips them,
    kio 0.6 raised KeyError and the connection was closed."""
    api_key, version = api
    frame = encode(RequestFactory(random.Random(seed)).request(api_key, version), 77)[4:]
    client_id_length = int.from_bytes(frame[8:10], "big", signed=True)
    block_at = 10 + max(client_id_length, 0)
    assert frame[block_at] == 0  # the header defines no tagged field
    block = bytes([len(tags)]) + b"".join(_uvarint(tag) + _uvarint(len(data)) + data for tag, data in sorted(tags))
    tagged = frame[:block_at] + block + frame[block_at + 1:]
    assert decode_request(tagged, SUPPORTED) == decode_request(frame, SUPPORTED)


def test_unknown_tagged_fields_are_dropped_and_known_ones_kept_at_every_depth():
    # Fetch v12 with its tagged cluster_id (tag 0), then an unknown tag 9 in the same block.
    from kio.schema.fetch.v12.request import FetchRequest
    request = FetchRequest(cluster_id="c", replica_id=-1, max_wait=timedelta(milliseconds=5), min_bytes=1,
                           max_bytes=1000, isolation_level=0, session_id=0, session_epoch=-1, topics=(),
                           forgotten_topics_data=(), rack_id="")
    frame = encode(request, 5)[4:]
    assert frame.endswith(bytes([1, 0, 2, 2]) + b"c")
    tagged = frame[:-5] + bytes([2, 0, 2, 2]) + b"c" + bytes([9, 3]) + b"xyz"
    assert decode_request(tagged, SUPPORTED).body == request
    # Metadata v12: an unknown tag inside a topic entry (a nested entity) and in the body.
    header = bytes.fromhex("0003000c00000007ffff00")
    topic = bytes(16) + bytes([2]) + b"t"
    plain = header + bytes([2]) + topic + bytes([0]) + bytes([1, 0, 0])
    nested = header + bytes([2]) + topic + bytes([1, 40, 1, 7]) + bytes([1, 0]) + bytes([1]) + _uvarint(300) + bytes([0])
    assert decode_request(nested, SUPPORTED).body == decode_request(plain, SUPPORTED).body
