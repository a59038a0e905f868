"""The classes generated from Kafka 3.9's schemas for what kio 0.6 lacks.

Every generated version round-trips through kio's own reader and writer, the codec finds
them when kio has no such version, and frames packed by hand from the protocol guide (an
encoder independent of the generator) decode to the values they carry.
"""

import io
import struct
import uuid
from pkgutil import resolve_name

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from ottla.protocol.codec import decode_request, encode_response
from ottla.protocol.legacy import index
from ottla.protocol.schemas import request_schema, response_schema
from tests.schema_samples import sample

GENERATED = sorted([("request", *key, path) for key, path in index.REQUESTS.items()]
                   + [("response", *key, path) for key, path in index.RESPONSES.items()])


@pytest.mark.parametrize("kind,api_key,version,path", GENERATED,
                         ids=[f"{kind}-{key}-v{version}" for kind, key, version, _ in GENERATED])
def test_every_generated_version_round_trips(kind, api_key, version, path):
    schema = resolve_name(path)
    assert (schema.__api_key__, schema.__version__) == (api_key, version)
    value = sample(schema)
    out = io.BytesIO()
    entity_writer(schema)(out, value)
    data = out.getvalue()
    decoded, size = entity_reader(schema)(memoryview(data), 0)
    assert decoded == value
    assert size == len(data)


def test_the_four_controller_apis_cover_every_kafka_3_9_version():
    assert sorted(v for k, v in index.REQUESTS if k == 4) == list(range(8))   # LeaderAndIsr 0-7
    assert sorted(v for k, v in index.REQUESTS if k == 5) == list(range(5))   # StopReplica 0-4
    assert sorted(v for k, v in index.REQUESTS if k == 6) == list(range(9))   # UpdateMetadata 0-8
    assert sorted(v for k, v in index.REQUESTS if k == 7) == list(range(4))   # ControlledShutdown 0-3
    assert set(index.REQUESTS) == set(index.RESPONSES)


def test_lookup_prefers_kio_and_falls_back_to_generated():
    assert request_schema(3, 12).__module__.startswith("kio.")
    assert request_schema(4, 7).__module__.startswith("ottla.protocol.legacy.")
    assert response_schema(7, 0).__module__.startswith("ottla.protocol.legacy.")


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def _compact_string(text: str) -> bytes:
    return bytes([len(text) + 1]) + text.encode()


def _int32s(*values: int) -> bytes:
    return struct.pack(">i", len(values)) + b"".join(struct.pack(">i", v) for v in values)


def _compact_int32s(*values: int) -> bytes:
    return bytes([len(values) + 1]) + b"".join(struct.pack(">i", v) for v in values)


def _header_v1(api_key, version, correlation_id=5, client_id="legacy"):
    return struct.pack(">hhi", api_key, version, correlation_id) + _string(client_id)


def _header_v2(api_key, version, correlation_id=5, client_id="legacy"):
    return _header_v1(api_key, version, correlation_id, client_id) + b"\x00"


SUPPORTED = {4: (0, 7), 5: (0, 4), 6: (0, 8), 7: (0, 3)}


def test_hand_packed_leader_and_isr_v0():
    partition = (_string("orders") + struct.pack(">iiii", 2, 9, 1, 4) + _int32s(1, 2)
                 + struct.pack(">i", 17) + _int32s(1, 2, 3))
    frame = (_header_v1(4, 0) + struct.pack(">ii", 1, 9) + struct.pack(">i", 1) + partition
             + struct.pack(">i", 1) + struct.pack(">i", 1) + _string("broker1") + struct.pack(">i", 9092))
    decoded = decode_request(frame, SUPPORTED)
    body = decoded.body
    assert (decoded.api_key, decoded.api_version, decoded.header.client_id) == (4, 0, "legacy")
    assert (body.controller_id, body.controller_epoch) == (1, 9)
    state = body.ungrouped_partition_states[0]
    assert (state.topic_name, state.partition_index, state.leader, state.leader_epoch) == ("orders", 2, 1, 4)
    assert (state.isr, state.partition_epoch, state.replicas) == ((1, 2), 17, (1, 2, 3))
    assert (body.live_leaders[0].host_name, body.live_leaders[0].port) == ("broker1", 9092)


def test_hand_packed_leader_and_isr_v7_flexible():
    topic_id = uuid.UUID(int=0xABCDEF)
    partition = (struct.pack(">iiii", 0, 3, 2, 8) + _compact_int32s(2) + struct.pack(">i", 5)
                 + _compact_int32s(2, 3) + _compact_int32s() + _compact_int32s(3) + b"\x01" + b"\x01" + b"\x00")
    topic = _compact_string("t") + topic_id.bytes + bytes([2]) + partition + b"\x00"
    leader = struct.pack(">i", 2) + _compact_string("h") + struct.pack(">i", 1) + b"\x00"
    frame = (_header_v2(4, 7) + struct.pack(">i", 3000) + b"\x01" + struct.pack(">iqb", 4, 77, 2)
             + bytes([2]) + topic + bytes([2]) + leader + b"\x00")
    body = decode_request(frame, SUPPORTED).body
    assert (body.controller_id, body.is_k_raft_controller, body.controller_epoch) == (3000, True, 4)
    assert (body.broker_epoch, body.type_) == (77, 2)
    state = body.topic_states[0].partition_states[0]
    assert body.topic_states[0].topic_id == topic_id
    assert (state.removing_replicas, state.is_new, state.leader_recovery_state) == ((3,), True, 1)


def test_hand_packed_update_metadata_v8_with_tagged_type():
    frame = (_header_v2(6, 8) + struct.pack(">i", 1) + b"\x00" + struct.pack(">iq", 2, 10)
             + bytes([1])  # no topic states
             + bytes([2]) + struct.pack(">i", 1) + bytes([2]) + struct.pack(">i", 9092) + _compact_string("h")
             + _compact_string("PLAINTEXT") + struct.pack(">h", 0) + b"\x00" + b"\x00"  # rack null
             + b"\x00"
             + bytes([1, 0, 1, 2]))  # one tagged field: tag 0, size 1, Type=2
    body = decode_request(frame, SUPPORTED).body
    assert body.type_ == 2
    broker = body.live_brokers[0]
    assert (broker.id_, broker.rack, broker.endpoints[0].listener) == (1, None, "PLAINTEXT")


def test_hand_packed_stop_replica_v0_and_controlled_shutdown_v0_without_client_id():
    frame = (_header_v1(5, 0) + struct.pack(">ii", 1, 2) + b"\x01" + struct.pack(">i", 1)
             + _string("orders") + struct.pack(">i", 3))
    body = decode_request(frame, SUPPORTED).body
    assert body.delete_partitions is True
    assert (body.ungrouped_partitions[0].topic_name, body.ungrouped_partitions[0].partition_index) == ("orders", 3)
    # ControlledShutdown v0 uses request header v0: no client id at all.
    decoded = decode_request(struct.pack(">hhi", 7, 0, 42) + struct.pack(">i", 5), SUPPORTED)
    assert (decoded.correlation_id, decoded.body.broker_id) == (42, 5)
    assert not hasattr(decoded.header, "client_id")


def test_responses_encode_as_the_protocol_guide_says():
    schema = response_schema(4, 0)
    error = schema.__dataclass_fields__["partition_errors"].type.__args__[0]
    response = schema(error_code=ErrorCode.none,
                      partition_errors=(error(topic_name="t", partition_index=1, error_code=ErrorCode.none),))
    frame = b"".join(bytes(chunk) for chunk in encode_response(4, 0, 9, response))
    assert frame == (struct.pack(">ii", 4 + 2 + 4 + 3 + 4 + 2, 9) + struct.pack(">h", 0)
                     + struct.pack(">i", 1) + _string("t") + struct.pack(">ih", 1, 0))
    shutdown = response_schema(7, 3)
    frame = b"".join(bytes(chunk) for chunk in encode_response(7, 3, 9, shutdown(error_code=ErrorCode.none, remaining_partitions=())))
    assert frame[4:] == struct.pack(">i", 9) + b"\x00" + struct.pack(">h", 0) + bytes([1]) + b"\x00"


def _kafka_python_old_classes():
    """kafka-python's hand-written structs for old versions: (api key, version, kind) -> class."""
    import importlib
    import pkgutil

    import kafka.protocol.old as old
    classes = {}
    for info in pkgutil.iter_modules(old.__path__):
        module = importlib.import_module(f"kafka.protocol.old.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, type) and hasattr(value, "SCHEMA") and isinstance(getattr(value, "API_KEY", None), int):
                kind = "request" if "Request_v" in name else "response" if "Response_v" in name else None
                if kind and isinstance(getattr(value, "API_VERSION", None), int):
                    classes[(value.API_KEY, value.API_VERSION, kind)] = value
    return classes


def _plain(value):
    """A generated entity as kafka-python's nested tuples, in field order."""
    import dataclasses
    import datetime

    if dataclasses.is_dataclass(value):
        return tuple(_plain(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, ErrorCode):
        return value.value
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return value


KAFKA_PYTHON = _kafka_python_old_classes()
# kafka-python's DescribeLogDirsRequest_v0 declares Partitions as one int32 where Kafka's
# schema has []int32; v0 has v1's layout, so that one is checked against kio's v1 instead.
KAFKA_PYTHON_WRONG = {(35, 0, "request")}
CROSS_CHECKED = [(kind, key, version, path) for kind, key, version, path in GENERATED
                 if (key, version, kind) in KAFKA_PYTHON and (key, version, kind) not in KAFKA_PYTHON_WRONG]


@pytest.mark.parametrize("kind,api_key,version,path", CROSS_CHECKED,
                         ids=[f"{kind}-{key}-v{version}" for kind, key, version, _ in CROSS_CHECKED])
def test_old_versions_encode_byte_for_byte_like_kafka_python(kind, api_key, version, path):
    """kafka-python's structs were written by hand from the protocol guide: an independent encoder."""
    schema = resolve_name(path)
    value = sample(schema)
    out = io.BytesIO()
    entity_writer(schema)(out, value)
    theirs = KAFKA_PYTHON[(api_key, version, kind)](*_plain(value)).encode()
    assert bytes(theirs) == out.getvalue()


def test_describe_log_dirs_v0_request_is_laid_out_like_kios_v1():
    from kio.index import load_request_schema

    ours, kios = request_schema(35, 0), load_request_schema(35, 1)
    value = sample(ours)
    topic = kios.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
    theirs = kios(topics=tuple(topic(topic=t.topic, partitions=t.partitions) for t in value.topics))
    out_ours, out_theirs = io.BytesIO(), io.BytesIO()
    entity_writer(ours)(out_ours, value)
    entity_writer(kios)(out_theirs, theirs)
    assert out_ours.getvalue() == out_theirs.getvalue()


def test_kafka_python_cross_check_covers_the_kip_896_versions():
    covered = {(key, version) for _, key, version, _ in CROSS_CHECKED} | {(35, 0)}
    for api_key, versions in {0: (0, 1, 2), 1: (0, 1, 2, 3), 2: (0,), 8: (0, 1), 9: (0,), 19: (0, 1),
                              20: (0,), 32: (0,), 29: (0,), 30: (0,), 31: (0,), 35: (0,)}.items():
        assert {(api_key, v) for v in versions} <= covered, api_key
