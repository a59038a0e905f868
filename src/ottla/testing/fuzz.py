"""Structure-aware request fuzzing: valid requests of every API and version, then mutations.

`valid_request(api_key, version, rng)` builds a request from kio's schema classes with small
values (names from `names`, so some requests touch real topics and groups); `mutate`
damages its bytes the way a hostile or broken client would (lying lengths and counts,
varints, truncation, bit flips, unknown keys and versions, tagged-field garbage), and
`fuzz_batches` damages the record batches inside otherwise valid Produce requests, whose
only right answer is CORRUPT_MESSAGE or INVALID_RECORD.
`run` drives a real broker with them from several connections at once, next to a
bystander producer and consumer (`benchmarks/fuzz.py`, `tests/integration/test_fuzz.py`).
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
import socket
import struct
import threading
import time
import types
import typing
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from kio.serial import entity_writer

from ..protocol.schemas import request_schema
from . import fuzz_batches

_SIZE = struct.Struct(">i")


def _is_nullable(annotation) -> bool:
    return (typing.get_origin(annotation) in (types.UnionType, typing.Union)
            and types.NoneType in typing.get_args(annotation))


def _strip_none(annotation):
    if _is_nullable(annotation):
        return next(arg for arg in typing.get_args(annotation) if arg is not types.NoneType)
    return annotation


class RequestFactory:
    """Builds small valid requests; `names` are the strings used for every string field."""

    def __init__(self, rng: random.Random, names: tuple[str, ...] = ("fuzz",), records: tuple[bytes, ...] = ()):
        self.rng = rng
        self.names = names
        self.records = records

    def request(self, api_key: int, version: int):
        return self._entity(request_schema(api_key, version))

    def _entity(self, entity_type):
        values = {}
        for member in dataclasses.fields(entity_type):
            if member.metadata.get("tag") is not None and self.rng.random() < 0.5:
                continue  # leave the tagged field at its default
            values[member.name] = self._value(member.type, member.metadata.get("kafka_type"))
        return entity_type(**values)

    def _value(self, annotation, kafka_type):
        rng = self.rng
        if _is_nullable(annotation) and rng.random() < 0.15:
            return None
        inner = _strip_none(annotation)
        if typing.get_origin(inner) is tuple:
            element = typing.get_args(inner)[0]
            return tuple(self._value(element, kafka_type) for _ in range(rng.choice((0, 1, 1, 2))))
        if dataclasses.is_dataclass(inner):
            return self._entity(inner)
        return self._primitive(inner, kafka_type)

    def _primitive(self, python_type, kafka_type):
        rng = self.rng
        if kafka_type == "string":
            return rng.choice(self.names)
        if kafka_type == "records":
            return rng.choice(self.records) if self.records else b""
        if kafka_type == "bytes":
            return bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
        if kafka_type == "uuid":
            return uuid.UUID(int=rng.getrandbits(128) | 1) if rng.random() < 0.3 else None  # kio: zero is None
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            return timedelta(milliseconds=rng.choice((0, 1, 100)))
        if kafka_type == "float64":
            return 0.0
        if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "uint8", "uint32", "uint64"):
            low = 0 if kafka_type.startswith("u") else -1
            return python_type(rng.choice((low, 0, 0, 1, 2, 3)))
        raise TypeError(f"no value for kafka_type {kafka_type!r} ({python_type})")


def encode(request, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    """A size-prefixed frame."""
    header_type = type(request).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(request_api_key=request.__api_key__,
                                                request_api_version=request.__version__,
                                                correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(request))(out, request)
    payload = out.getvalue()
    return _SIZE.pack(len(payload)) + payload


_LIES = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000)


def mutate(frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One damaged copy of a valid frame and the name of what was done to it."""
    data = bytearray(frame)
    body_start = 12  # size, api key, version, correlation id
    kind = rng.choice(("flip", "lie32", "lie16", "varint", "truncate", "extend", "version", "api_key",
                       "tagged", "splice", "zero"))
    if len(data) <= body_start:
        kind = "extend"
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(4, len(data))
            data[position] ^= 1 << rng.randrange(8)
    elif kind == "lie32" and len(data) >= body_start + 4:
        position = rng.randrange(body_start, len(data) - 3)
        data[position:position + 4] = struct.pack(">I", rng.choice(_LIES) & 0xFFFFFFFF)
    elif kind == "lie16" and len(data) >= body_start + 2:
        position = rng.randrange(body_start, len(data) - 1)
        data[position:position + 2] = struct.pack(">H", rng.choice(_LIES) & 0xFFFF)
    elif kind == "varint":
        position = rng.randrange(body_start, len(data))
        data[position:position + 1] = rng.choice((b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\x00",
                                                  b"\x80\x80\x80\x80\x80\x01", b"\xff\xff\x03", b"\x01"))
    elif kind == "truncate":
        del data[rng.randrange(body_start, len(data)):]
    elif kind == "extend":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "version":
        data[6:8] = struct.pack(">h", rng.choice((-1, 99, 32767, rng.randrange(20))))
    elif kind == "api_key":
        data[4:6] = struct.pack(">h", rng.choice((-1, 999, 32767, rng.randrange(100))))
    elif kind == "tagged":
        # Replace the last byte (often the empty tagged-field section) with garbage tags.
        data[-1:] = bytes((rng.randint(1, 3), rng.randrange(128), rng.randrange(128))) + \
            bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    elif kind == "splice":
        start = rng.randrange(body_start, len(data))
        data[start:start] = data[body_start:rng.randrange(body_start, len(data)) + 1]
    elif kind == "zero":
        start = rng.randrange(body_start, len(data))
        data[start:start + rng.randint(1, 8)] = bytes(min(8, len(data) - start))
    # The size prefix stays true: a frame that lies about its own size only makes the broker
    # wait for bytes that never come (FrameDecoder and the F7 tests cover those).
    _SIZE.pack_into(data, 0, len(data) - 4)
    return kind, bytes(data)


# --- the harness ---------------------------------------------------------------------------

_PROBE_IDS = 1_500_000_000  # correlation ids of the follow-up ApiVersions requests
BYSTANDER_TOPIC = "bystander"


@dataclass
class FuzzReport:
    frames: int = 0
    answered: int = 0  # the follow-up ApiVersions came back: the connection still works
    closed: int = 0  # the broker closed the connection
    silent: list[str] = field(default_factory=list)  # hex of frames after which nothing came
    broker_died: bool = False
    peak_rss_bytes: int = 0
    worst_lag_ms: float | None = None
    worst_lag_cpu_ms: float | None = None  # the loop thread's own CPU in its worst interval
    lag_context: list[str] = field(default_factory=list)  # the log lines just before the worst lag
    longest_steps: str = ""  # the broker's longest single step per API ("Metadata v12 130 ms, ...")
    longest_gc: str = ""  # its longest garbage collection per generation
    handler_failures: Counter = field(default_factory=Counter)  # "Fetch v11: TypeError" -> count
    bystander_sent: int = 0
    bystander_exact: bool = False
    bystander_detail: str = ""
    restarted_cleanly: bool = False
    seconds: float = 0.0
    kinds: Counter = field(default_factory=Counter)
    batch_answers: Counter = field(default_factory=Counter)  # "count_over: CORRUPT_MESSAGE" -> count
    wrong_batch_answers: list[str] = field(default_factory=list)  # hostile batches not refused as Kafka does


def hostile_batches() -> tuple[bytes, ...]:
    """Record sets for Produce fields: valid plain and compressed batches, and empty bytes."""
    from ..records.records import Record, build_batch
    records = [Record(key=b"k%d" % i, value=b"v" * (i * 7)) for i in range(5)]
    return (b"", build_batch(records), build_batch(records, compression="gzip"),
            build_batch(records, compression="zstd"), build_batch(records[:1], producer_id=7, producer_epoch=0,
                                                                   base_sequence=0))


class _Prober:
    """One fuzzing connection: send a frame, then an ApiVersions v0, and see what comes back."""

    def __init__(self, address: tuple[str, int], timeout_s: float):
        self.address = address
        self.timeout_s = timeout_s
        self.sock: socket.socket | None = None
        self.probe_id = _PROBE_IDS
        self.kept: bytes | None = None

    def send(self, frame: bytes, keep: int | None = None) -> str:
        """"answered", "closed" or "silent"; the response with correlation id `keep`, if any,
        is left in `kept`."""
        self.kept = None
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout_s)
        self.probe_id += 1
        from kio.schema.api_versions.v0.request import ApiVersionsRequest
        try:
            self.sock.sendall(frame + encode(ApiVersionsRequest(), self.probe_id, "probe"))
            while True:
                response = _read_frame(self.sock)
                if response is None:
                    return self._drop("closed")
                if len(response) >= 4 and _SIZE.unpack_from(response, 0)[0] == self.probe_id:
                    return "answered"
                if keep is not None and len(response) >= 4 and _SIZE.unpack_from(response, 0)[0] == keep:
                    self.kept = response
        except socket.timeout:
            return self._drop("silent")
        except (ConnectionError, OSError):
            return self._drop("closed")

    def _drop(self, outcome: str) -> str:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return outcome


def _read_frame(sock: socket.socket) -> bytes | None:
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    return _read_exactly(sock, _SIZE.unpack(header)[0])


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _advertised(address: tuple[str, int]) -> list[tuple[int, int]]:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.api_versions.v3.response import ApiVersionsResponse
    from kio.serial import entity_reader
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode(ApiVersionsRequest(client_software_name="fuzz", client_software_version="1"), 1))
        frame = _read_frame(sock)
    body, _ = entity_reader(ApiVersionsResponse)(frame, 4)  # ApiVersions answers with header v0
    return [(k.api_key, v) for k in body.api_keys for v in range(k.min_version, k.max_version + 1)]


def _rss_peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class _Bystander:
    """A producer and a consumer doing ordinary work while the fuzzing goes on."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import Consumer, Producer, TopicPartition
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bystander",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self.consumer.assign([TopicPartition(BYSTANDER_TOPIC, 0, 0)])
        self.sent: dict[int, bytes] = {}
        self.received: list[tuple[int, bytes]] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.produced = threading.Event()  # the producer has flushed: `sent` is final
        self.deadline = float("inf")
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _produce(self):
        from confluent_kafka import KafkaException

        def delivered(err, msg):
            if err is not None:
                self.failed.append(str(err))
            else:
                self.sent[msg.offset()] = msg.value()
        i = 0
        try:
            while not self.stop.is_set():
                self.producer.produce(BYSTANDER_TOPIC, value=b"bystander-%d-" % i + bytes([i % 256]) * (i % 300),
                                      partition=0, on_delivery=delivered)
                self.producer.poll(0.01)
                i += 1
            self.producer.flush(60)
        except KafkaException as exc:  # a fatal error stops the bystander: the run must say so
            self.failed.append(f"producer stopped after {i} records: {exc}")

    def _consume(self):
        while not self.produced.is_set() or len(self.received) < len(self.sent):
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.received.append((message.offset(), message.value()))
            if time.monotonic() > self.deadline:
                break

    def finish(self, timeout_s: float = 60.0) -> bool:
        self.deadline = time.monotonic() + 2 * timeout_s
        self.stop.set()
        self.threads[0].join(timeout_s + 10)
        self.produced.set()
        self.threads[1].join(timeout_s + 10)
        self.consumer.close()
        del self.producer  # before the broker stops, so librdkafka does not log reconnects
        expected = sorted(self.sent.items())
        self.detail = (f"{len(expected)} acknowledged, {len(self.received)} consumed, "
                       f"delivery errors {sorted(set(self.failed))[:3]}")
        for got, wanted in zip(self.received, expected):
            if got != wanted:
                self.detail += f"; first difference at offset {wanted[0]}: got offset {got[0]}"
                break
        return not self.failed and self.received == expected


_HOSTILE_BATCH_SHARE = 0.1
_BATCH_TOPIC = "hostile-batches"  # no fuzzed request names it, so none deletes it


def _send_request(prober: _Prober, rng: random.Random, factory: RequestFactory, apis, correlation_id: int,
                  report: FuzzReport, lock: threading.Lock) -> None:
    """A valid request of any API and version, damaged three times out of four."""
    api_key, version = rng.choice(apis)
    frame = encode(factory.request(api_key, version), correlation_id)
    kind = "valid"
    if rng.random() < 0.75:
        kind, frame = mutate(frame, rng)
    outcome = prober.send(frame)
    with lock:
        report.frames += 1
        report.kinds[kind] += 1
        if outcome == "answered":
            report.answered += 1
        elif outcome == "closed":
            report.closed += 1
        else:
            report.silent.append(frame.hex())


def _send_hostile_batch(prober: _Prober, rng: random.Random, correlation_id: int, batches, versions,
                        report: FuzzReport, lock: threading.Lock) -> None:
    """A valid Produce of one damaged batch: the partition must be refused, the connection kept."""
    kind, batch = fuzz_batches.mutate(rng.choice(batches), rng)
    version = rng.choice(versions)
    outcome = prober.send(encode(fuzz_batches.produce_request(batch, version, _BATCH_TOPIC), correlation_id),
                          keep=correlation_id)
    answer = "no answer" if prober.kept is None else fuzz_batches.partition_error(prober.kept, version).name
    with lock:
        report.frames += 1
        report.kinds[f"batch:{kind}"] += 1
        report.batch_answers[f"{kind}: {answer}"] += 1
        if outcome == "answered":
            report.answered += 1
        elif outcome == "closed":
            report.closed += 1
        else:
            report.silent.append(batch.hex())
        if outcome != "answered" or answer not in {code.name for code in fuzz_batches.refused(kind)}:
            report.wrong_batch_answers.append(f"Produce v{version} {kind}: {answer}, connection {outcome}, "
                                              f"batch {batch.hex()}")


def run(frames: int, *, seed: int = 0, workers: int = 4, timeout_s: float = 30.0,
        config: dict | None = None, progress=None) -> FuzzReport:
    """Fuzz a fresh broker with `frames` requests; returns what happened (see FuzzReport)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from . import broker as start_broker

    report = FuzzReport()
    started = time.monotonic()
    with start_broker(config, log_level="info") as handle:
        admin = AdminClient({"bootstrap.servers": handle.bootstrap})
        for future in admin.create_topics([NewTopic(BYSTANDER_TOPIC, 1, 1), NewTopic("fuzz", 2, 1),
                                                          NewTopic(_BATCH_TOPIC, 1, 1)]).values():
            future.result(60)
        del admin
        address = (handle.host, handle.port)
        apis = _advertised(address)
        bystander = _Bystander(handle.bootstrap)
        lock = threading.Lock()
        counter = iter(range(frames))
        records = hostile_batches()
        batches = fuzz_batches.valid_batches()
        produce_versions = [v for k, v in apis if k == 0 and v in (3, 9)]

        def work(worker: int):
            rng = random.Random(seed * 1000 + worker)
            factory = RequestFactory(rng, names=("fuzz", "fuzz-2", "x-bystander", ""), records=records)
            prober = _Prober(address, timeout_s)
            for number in counter:
                if rng.random() < _HOSTILE_BATCH_SHARE:
                    _send_hostile_batch(prober, rng, number + 1, batches, produce_versions, report, lock)
                else:
                    _send_request(prober, rng, factory, apis, number + 1, report, lock)
                if progress and number % 5000 == 0:
                    progress(f"{report.frames} frames, {len(report.silent)} silent")
                if not handle.running():
                    report.broker_died = True
                    return
            prober._drop("closed")

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report.broker_died = report.broker_died or not handle.running()
        if not report.broker_died:
            report.peak_rss_bytes = _rss_peak(handle.pid)
        report.bystander_exact = bystander.finish()
        report.bystander_sent = len(bystander.sent)
        report.bystander_detail = bystander.detail
        handle.stop()
        log_lines = handle.read_stderr().splitlines()
        lags = re.findall(r"event loop: worst lag (\d+) ms, worst CPU between two wake-ups (\d+) ms",
                          "\n".join(log_lines))
        if lags:
            report.worst_lag_ms, report.worst_lag_cpu_ms = float(lags[-1][0]), float(lags[-1][1])
        steps = re.findall(r"event loop: longest single steps: (.*); longest garbage collections: (.*)",
                           "\n".join(log_lines))
        report.longest_steps, report.longest_gc = steps[-1] if steps else ("", "")
        for line in log_lines:
            failed = re.search(r"(\S+ v\d+) handler failed on .*?, closing it: (\w+)", line) or \
                re.search(r"cannot encode the (\S+ v\d+) response .*?, closing it: (\w+)", line)
            if failed:
                report.handler_failures[f"{failed.group(1)}: {failed.group(2)}"] += 1
        noted = [i for i, line in enumerate(log_lines) if "the worst so far" in line]
        if noted:
            report.lag_context = log_lines[max(0, noted[-1] - 3):noted[-1] + 1]
        handle.start()
        report.restarted_cleanly = _advertised((handle.host, handle.port)) == apis
    report.seconds = time.monotonic() - started
    return report
