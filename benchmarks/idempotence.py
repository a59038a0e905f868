"""What idempotence costs on the produce path: the same producer with and without idempotence,
against one Ottla broker this script starts.

Both modes use identical settings -- acks=all, 5 requests in flight (the idempotent limit),
100-byte values, the same batching -- so the only difference is the producer id and the
sequence numbers in each batch and the broker's checks on them. Each run writes to a fresh
topic from its own producer process; runs alternate between the modes so drifts in machine
load hit both alike, and the median of the repeats is reported. After every run against
Ottla the high watermarks must add up to the records sent, and every partition must show
exactly one producer in DescribeProducers for idempotent runs and none otherwise.

Two load generators:

* confluent: confluent-kafka (librdkafka) with `enable.idempotence` on or off, default
  batching. The same runs also go to librdkafka's in-memory mock cluster, a broker that does
  no work: what the mock shows is the client's own difference between the modes (librdkafka's
  idempotent mode batches and pipelines differently), which Ottla cannot do better than.
* raw: pre-encoded Produce requests of `--raw-batch-records` records, five in flight on one
  connection; the two modes send byte-identical batches except for producer id, epoch and
  sequence. The client does almost nothing, so this isolates the broker's cost.

A run's rate is records divided by the time from the first record to the last
acknowledgement, after a warm-up: librdkafka's idempotent producer spends its first 0.5-1 s
in its own PID state machine (it looks for a usable broker every 500 ms before sending
InitProducerId), a fixed start-up cost reported separately as "first ack". Broker CPU is the
broker process's user+system time during the whole run; on a busy machine it is steadier
than rates.

    .venv/bin/python benchmarks/idempotence.py                  # 2M records x 5 repeats, ~4 min
    .venv/bin/python benchmarks/idempotence.py --records 200000 --repeat 3 --no-mock

Results table (Markdown) on stdout, progress on stderr; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import socket
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections import deque
from datetime import timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokerproc import Children, Mock, Ottla, cpu_seconds, produce_blocking, progress  # noqa: E402

MODES = {"idempotent": True, "non-idempotent": False}
VALUE_SIZE = 100
TARGET = 0.95  # the goal: idempotent throughput within 5% of non-idempotent
IN_FLIGHT = 5


def _values() -> list[bytes]:
    rng = random.Random(0)
    return [bytes(rng.getrandbits(8) for _ in range(VALUE_SIZE)) for _ in range(1024)]


# -- load generators (each run is its own process) -------------------------------------------


def role_confluent(args: argparse.Namespace) -> dict:
    values = _values()
    created = time.perf_counter()
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "enable.idempotence": args.idempotent,
        "max.in.flight.requests.per.connection": IN_FLIGHT,
        "log_level": 0,
    })
    producer.produce(args.topic, values[0])
    if producer.flush(60):
        raise SystemExit("warm-up record unacknowledged after 60 s")
    started = time.perf_counter()
    for i in range(args.records):
        produce_blocking(producer, args.topic, values[i % 1024])
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    seconds = time.perf_counter() - started
    if left:
        raise SystemExit(f"{left} records still unacknowledged after flush")
    return {"seconds": seconds, "first_ack": started - created, "records": args.records + 1}


class _RawConnection:
    """Just enough of the protocol to send pre-encoded requests and read their responses."""

    def __init__(self, bootstrap: str):
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    @staticmethod
    def encode(request, correlation_id: int) -> bytes:
        from kio.serial import entity_writer

        header_type = type(request).__header_schema__
        out = io.BytesIO()
        entity_writer(header_type)(out, header_type(request_api_key=request.__api_key__,
                                                    request_api_version=request.__version__,
                                                    correlation_id=correlation_id, client_id="bench"))
        entity_writer(type(request))(out, request)
        return struct.pack(">i", out.tell()) + out.getvalue()

    def receive(self, request_type: type):
        from kio.index import load_response_schema
        from kio.serial import entity_reader

        (size,) = struct.unpack(">i", self.reader.read(4))
        frame = self.reader.read(size)
        schema = load_response_schema(request_type.__api_key__, request_type.__version__)
        _, offset = entity_reader(schema.__header_schema__)(frame, 0)
        return entity_reader(schema)(frame, offset)[0]


def role_raw(args: argparse.Namespace) -> dict:
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.static.primitive import i16, i32, i64

    from ottla.records.records import Record, build_batch

    connection = _RawConnection(args.bootstrap)
    producer_id, epoch = -1, -1
    if args.idempotent:
        connection.sock.sendall(connection.encode(InitProducerIdRequest(
            transactional_id=None, transaction_timeout=timedelta(seconds=60),
            producer_id=i64(-1), producer_epoch=i16(-1)), 0))
        response = connection.receive(InitProducerIdRequest)
        producer_id, epoch = response.producer_id, response.producer_epoch
    values = _values()
    per_batch = args.raw_batch_records
    sequences = [0] * args.partitions
    frames = []
    for n, first in enumerate(range(0, args.records, per_batch)):
        partition = n % args.partitions
        records = [Record(None, values[i % 1024]) for i in range(first, min(first + per_batch, args.records))]
        batch = build_batch(records, producer_id=producer_id, producer_epoch=epoch,
                            base_sequence=sequences[partition] if args.idempotent else -1)
        sequences[partition] += len(records)
        frames.append(connection.encode(ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=timedelta(seconds=30),
            topic_data=(TopicProduceData(name=args.topic, partition_data=(
                PartitionProduceData(index=i32(partition), records=batch),)),)), n + 1))

    started = time.perf_counter()
    pending: deque[int] = deque()
    sent = 0
    while sent < len(frames) or pending:
        while sent < len(frames) and len(pending) < IN_FLIGHT:
            connection.sock.sendall(frames[sent])
            pending.append(sent)
            sent += 1
        pending.popleft()
        result = connection.receive(ProduceRequest).responses[0].partition_responses[0]
        if result.error_code != 0:
            raise SystemExit(f"produce failed: {result.error_code!r}")
    return {"seconds": time.perf_counter() - started, "first_ack": 0.0, "records": args.records}


ROLES = {"confluent": role_confluent, "raw": role_raw}


# -- orchestration ---------------------------------------------------------------------------


def _records_written(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-check", "log_level": 0})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def _producers_per_partition(bootstrap: str, topic: str) -> list[int]:
    from ottla.admin_client import AdminProtocolClient

    with AdminProtocolClient(bootstrap) as client:
        return [len(states) for states in client.describe_producers(topic).values()]


class _Target:
    def __init__(self, name: str, bootstrap: str, create_topic, pid: int | None):
        self.name, self.bootstrap, self.create_topic, self.pid = name, bootstrap, create_topic, pid


def _run(children: Children, target: _Target, generator: str, mode: str, args: argparse.Namespace) -> dict:
    topic = f"bench-{generator}-{mode}-{uuid.uuid4().hex[:6]}"
    target.create_topic(topic, args.partitions)
    command = [sys.executable, __file__, "--role", generator, "--bootstrap", target.bootstrap, "--topic", topic,
               "--records", str(args.records), "--partitions", str(args.partitions),
               "--raw-batch-records", str(args.raw_batch_records)]
    if MODES[mode]:
        command.append("--idempotent")
    cpu_before = cpu_seconds(target.pid) if target.pid else 0.0
    result = children.run_json(command, f"{generator} producer")
    result["broker_cpu"] = cpu_seconds(target.pid) - cpu_before if target.pid else None
    if target.name == "ottla":
        written = _records_written(target.bootstrap, topic, args.partitions)
        if written != result["records"]:
            raise RuntimeError(f"{generator} {mode}: {written} records in the log, {result['records']} sent")
        producers = _producers_per_partition(target.bootstrap, topic)
        expected = [1 if MODES[mode] else 0] * args.partitions
        if producers != expected:
            raise RuntimeError(f"{generator} {mode}: active producers per partition {producers}, expected {expected}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--raw-batch-records", type=int, default=200, help="records per batch of the raw generator")
    parser.add_argument("--no-mock", action="store_true", help="skip the librdkafka mock cluster yardstick")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--idempotent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        print(json.dumps(ROLES[args.role](args)))
        return 0

    with Children() as children, tempfile.TemporaryDirectory(prefix="ottla-bench-idem-") as workdir:
        broker = Ottla(children, Path(workdir) / "data")
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})

        def create(topic: str, partitions: int) -> None:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)

        cases = [(_Target("ottla", broker.bootstrap, create, broker.proc.pid), "confluent"),
                 (_Target("ottla", broker.bootstrap, create, broker.proc.pid), "raw")]
        if not args.no_mock:
            mock = Mock(children)
            cases.append((_Target("mock", mock.bootstrap, mock.create_topic, None), "confluent"))
        samples: dict[tuple[str, str, str], list[dict]] = {}
        for rep in range(args.repeat):
            for target, generator in cases:
                for mode in list(MODES) if rep % 2 == 0 else list(reversed(MODES)):
                    result = _run(children, target, generator, mode, args)
                    samples.setdefault((generator, target.name, mode), []).append(result)
                    progress(f"run {rep + 1}/{args.repeat} {generator} -> {target.name} {mode}: "
                             f"{args.records / result['seconds']:,.0f} records/s")
        broker.stop()

    print(f"{args.records:,} records of {VALUE_SIZE} bytes, {args.partitions} partitions, acks=all, "
          f"{IN_FLIGHT} in flight, raw batches of {args.raw_batch_records} records, "
          f"median of {args.repeat} runs each\n")
    print("| generator | broker | mode | records/s | MB/s (values) | runs (records/s) | broker CPU (s) | first ack (s) |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: |")
    rates = {}
    for (generator, target, mode), runs in samples.items():
        rates[generator, target, mode] = rate = args.records / statistics.median(r["seconds"] for r in runs)
        each = sorted(args.records / r["seconds"] for r in runs)
        cpu = "-" if runs[0]["broker_cpu"] is None else f"{statistics.median(r['broker_cpu'] for r in runs):.2f}"
        first_ack = statistics.median(r["first_ack"] for r in runs)
        print(f"| {generator} | {target} | {mode} | {rate:,.0f} | {rate * VALUE_SIZE / 1e6:.1f} | "
              f"{each[0]:,.0f} - {each[-1]:,.0f} | {cpu} | {first_ack:.2f} |")
    print()
    for generator, target, _ in list(rates)[::2]:
        ratio = rates[generator, target, "idempotent"] / rates[generator, target, "non-idempotent"]
        verdict = "meets" if ratio >= TARGET else "misses"
        print(f"- {generator} -> {target}: idempotent / non-idempotent = {ratio:.3f} "
              f"({verdict} the >= {TARGET:.2f} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
