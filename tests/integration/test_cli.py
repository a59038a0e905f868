"""The client CLI run as users run it: `python -m ottla.cli ...` as a subprocess, against a broker."""

from __future__ import annotations

import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kio.schema.errors import ErrorCode

from ottla.protocol.build import make, nested
from ottla.protocol.codec import FrameDecoder, decode_request, encode_response, response_schema



def run_cli(bootstrap: str, *args: str, input: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    """One CLI run; the broker address comes from OTTLA_BOOTSTRAP, as in a user's shell."""
    env = {**os.environ, "OTTLA_BOOTSTRAP": bootstrap}
    result = subprocess.run([sys.executable, "-m", "ottla.cli", *args], input=input, env=env,
                            capture_output=True, timeout=timeout)
    result.out = result.stdout.decode()
    result.err = result.stderr.decode()
    assert "Traceback" not in result.err, result.err
    return result


@pytest.fixture
def cli(ottla_broker):
    return lambda *args, **kwargs: run_cli(ottla_broker.bootstrap, *args, **kwargs)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.err
    return result


def table(text: str, header: str) -> list[dict[str, str]]:
    """Rows of the whitespace-aligned table in `text` whose first column is `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    names = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(names, line.split())))
    return rows


def fields(text: str) -> dict[str, str]:
    return {line.split(None, 1)[0]: line.split(None, 1)[1].strip()
            for line in text.splitlines() if len(line.split(None, 1)) == 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_topic_lifecycle(cli):
    ok(cli("topics", "create", "orders", "-p", "3", "-c", "retention.ms=3600000"))
    again = cli("topics", "create", "orders")
    assert again.returncode == 1 and "topic 'orders' already exists" in again.err

    assert {"NAME": "orders", "PARTITIONS": "3", "REPLICAS": "1"} in table(ok(cli("topics", "list")).out, "NAME")

    described = ok(cli("topics", "describe", "orders")).out
    assert fields(described)["PARTITIONS"] == "3"
    assert re.fullmatch(r"[\w+/=-]{22,}", fields(described)["TOPIC-ID"])
    partitions = table(described, "PARTITION")
    assert [row["PARTITION"] for row in partitions] == ["0", "1", "2"]
    assert all(row["LOG-START"] == row["HIGH-WATERMARK"] == "0" for row in partitions)
    configs = {row["CONFIG"]: row for row in table(described, "CONFIG")}
    assert configs["retention.ms"]["VALUE"] == "3600000"
    assert configs["retention.ms"]["SOURCE"] == "dynamic_topic_config"

    ok(cli("topics", "alter-config", "orders", "--set", "cleanup.policy=compact", "--delete", "retention.ms"))
    configs = {row["CONFIG"]: row for row in table(ok(cli("topics", "describe", "orders")).out, "CONFIG")}
    assert configs["cleanup.policy"]["VALUE"] == "compact"
    assert configs["retention.ms"]["SOURCE"] == "default_config"

    assert ok(cli("topics", "delete", "orders")).out == "deleted topic orders\n"
    assert "orders" not in ok(cli("topics", "list")).out
    gone = cli("topics", "delete", "orders")
    assert gone.returncode == 1 and "topic 'orders' does not exist" in gone.err


def test_produce_then_consume_exactly(cli):
    ok(cli("topics", "create", "events", "-p", "1"))
    lines = b"user1:login\nuser2:click:button\n:empty key\nno separator\n\nuser1:logout\n"
    produced = ok(cli("produce", "events", "-k", ":", "-H", "source=cli", input=lines))
    assert "produced 6 record(s) to events, 0 failed" in produced.err

    consumed = ok(cli("consume", "events", "-e", "-f", r"%o|%k|%K|%v|%h"))
    assert consumed.out.splitlines() == [
        "0|user1|5|login|source=cli",
        "1|user2|5|click:button|source=cli",
        "2||0|empty key|source=cli",
        "3||-1|no separator|source=cli",
        "4||-1||source=cli",
        "5|user1|5|logout|source=cli",
    ]
    assert ok(cli("consume", "events", "-n", "2", "--print-keys")).out == "user1\tlogin\nuser2\tclick:button\n"
    assert ok(cli("consume", "events", "-e", "-o", "4", "--print-offsets")).out == "0:4\t\n0:5\tlogout\n"
    assert ok(cli("consume", "events", "-e", "-o", "-1")).out == "logout\n"
    assert ok(cli("consume", "events", "-e", "-o", "end")).out == ""

    beyond = cli("consume", "events", "-e", "-o", "99")
    assert beyond.returncode == 1 and "out of range" in beyond.err.lower()


def test_produce_to_chosen_partitions_and_consume_all(cli):
    ok(cli("topics", "create", "spread", "-p", "3"))
    for partition in range(3):
        ok(cli("produce", "spread", "-p", str(partition), "--acks", "1", "--compression", "zstd",
               input=f"p{partition}-a\np{partition}-b\n".encode()))
    everything = ok(cli("consume", "spread", "-e", "-f", "%p %o %v")).out.splitlines()
    assert sorted(everything) == sorted(f"{p} {o} p{p}-{x}" for p in range(3) for o, x in enumerate("ab"))
    assert ok(cli("consume", "spread", "-e", "-p", "2")).out == "p2-a\np2-b\n"
    missing = cli("consume", "spread", "-p", "7", "-e")
    assert missing.returncode == 1 and "topic 'spread' has no partition 7" in missing.err


def test_delivery_failures_are_counted_and_fail_the_run(cli):
    ok(cli("topics", "create", "tiny", "-c", "max.message.bytes=200"))
    rejected = cli("produce", "tiny", "--acks", "all", input=b"x" * 1000 + b"\n")
    assert rejected.returncode == 1
    assert "produced 0 record(s) to tiny, 1 failed" in rejected.err
    assert "ottla: first failure: Broker: Message size too large" in rejected.err


def test_unknown_topic_is_reported(cli):
    for command in (["topics", "describe", "ghost"], ["topics", "alter-config", "ghost", "--set", "retention.ms=1"],
                    ["topics", "delete", "ghost"], ["produce", "ghost"], ["consume", "ghost", "-e"],
                    ["producers", "describe", "ghost"]):
        result = cli(*command, input=b"record\n")
        assert (result.returncode, result.err) == (1, "ottla: topic 'ghost' does not exist\n"), command


def test_broker_down_is_reported_without_waiting_out_the_timeout():
    """Nothing listens: each command says so from its own first connection attempt and exits 1,
    where librdkafka would retry until --timeout and then name its own attempt ("Connect to
    ipv4#... failed: ..."). With a --timeout far past the run's limit, a command that waited
    it out would be cut off and fail; the time is printed, not asserted."""
    address = f"127.0.0.1:{free_port()}"
    for command in (["topics", "list"], ["topics", "create", "t"], ["produce", "t"], ["consume", "t"],
                    ["groups", "list"], ["transactions", "list"], ["producers", "describe", "t"]):
        started = time.monotonic()
        result = run_cli(address, *command, "--timeout", "3600", input=b"record\n", timeout=120)
        print(f"{' '.join(command)}: exit {result.returncode} after {time.monotonic() - started:.2f} s")
        assert result.returncode == 1, command
        assert result.err == f"ottla: cannot reach broker at {address} (Connection refused)\n", command


@pytest.mark.parametrize("command, message", [
    (["topics", "create"], "required: name"),
    (["topics", "create", "t", "-c", "oops"], "expected KEY=VALUE"),
    (["topics", "create", "t", "-p", "0"], "must be at least 1"),
    (["topics", "alter-config", "t"], "give at least one --set"),
    (["consume", "t", "-f", "%z"], "unknown sequence '%z'"),
    (["consume", "t", "-o", "middle"], "expected beginning, end"),
    (["consume", "t", "-o", "stored"], "-o stored needs --group"),
    (["produce", "t", "--acks", "2"], "invalid choice"),
    (["transactions", "abort", "--topic", "t", "--partition", "0"], "give --start-offset"),
    (["transactions", "abort", "--topic", "t", "--partition", "0", "--start-offset", "3",
      "--producer-id", "1"], "cannot be combined"),
])
def test_bad_arguments_exit_2(command, message):
    result = run_cli("127.0.0.1:1", *command)
    assert result.returncode == 2
    assert message in result.err


def test_consumer_group_members_offsets_and_lag(cli, ottla_broker):
    ok(cli("topics", "create", "work", "-p", "2"))
    ok(cli("produce", "work", "-p", "0", input=b"a\nb\nc\n"))
    ok(cli("produce", "work", "-p", "1", input=b"d\n"))
    first = cli("consume", "work", "-g", "workers", "-p", "0", "-n", "2")
    assert ok(first).out == "a\nb\n"
    described = ok(cli("groups", "describe", "workers")).out
    assert fields(described)["MEMBERS"] == "0"
    assert table(described, "TOPIC") == [{"TOPIC": "work", "PARTITION": "0", "CURRENT-OFFSET": "2",
                                          "LOG-END-OFFSET": "3", "LAG": "1", "MEMBER-ID": "-"}]

    tail = subprocess.Popen([sys.executable, "-m", "ottla.cli", "consume", "work", "-g", "workers"],
                            env={**os.environ, "OTTLA_BOOTSTRAP": ottla_broker.bootstrap},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert sorted([tail.stdout.readline(), tail.stdout.readline()]) == [b"c\n", b"d\n"]
        for _ in range(100):
            described = ok(cli("groups", "describe", "workers")).out
            if fields(described)["STATE"] == "STABLE":
                break
            time.sleep(0.2)
        [member] = table(described, "MEMBER-ID")
        assert member["CLIENT-ID"] == "ottla-cli" and member["ASSIGNMENT"] == "work:0,1"
        assert {row["MEMBER-ID"] for row in table(described, "TOPIC")} == {member["MEMBER-ID"]}
    finally:
        tail.terminate()  # SIGTERM: the consumer commits and leaves the group
        _, errors = tail.communicate(timeout=30)
    assert tail.returncode == 0, errors.decode()

    described = ok(cli("groups", "describe", "workers")).out
    assert fields(described)["STATE"] == "EMPTY"
    assert [(row["PARTITION"], row["CURRENT-OFFSET"], row["LAG"]) for row in table(described, "TOPIC")] == [
        ("0", "3", "0"), ("1", "1", "0")]
    assert {"GROUP": "workers", "STATE": "EMPTY", "TYPE": "CLASSIC"} in table(ok(cli("groups", "list")).out, "GROUP")

    assert ok(cli("groups", "delete", "workers")).out == "deleted group workers\n"
    gone = cli("groups", "describe", "workers")
    assert gone.returncode == 1 and "group 'workers' does not exist" in gone.err


def test_hanging_transaction_is_found_and_aborted(cli, ottla_broker):
    from confluent_kafka import Producer

    ok(cli("topics", "create", "ledger", "-p", "1"))
    producer = Producer({"bootstrap.servers": ottla_broker.bootstrap, "transactional.id": "stuck",
                         "log_level": 0})
    producer.init_transactions(5)
    producer.begin_transaction()
    producer.produce("ledger", b"never committed")
    assert producer.flush(10) == 0

    described = cli("producers", "describe", "ledger")
    [state] = table(ok(described).out, "PARTITION")
    assert state["TXN-START-OFFSET"] == "0"
    listed = table(ok(cli("transactions", "list")).out, "TRANSACTIONAL-ID")
    assert {"TRANSACTIONAL-ID": "stuck", "PRODUCER-ID": state["PRODUCER-ID"], "STATE": "Ongoing"} in listed
    transaction = fields(ok(cli("transactions", "describe", "stuck")).out)
    assert transaction["STATE"] == "Ongoing" and transaction["PARTITIONS"] == "ledger-0"
    unknown = cli("transactions", "describe", "nobody")
    assert (unknown.returncode, unknown.err) == (1, "ottla: transaction 'nobody' does not exist\n")
    [offsets] = table(ok(cli("topics", "describe", "ledger")).out, "PARTITION")
    assert (offsets["HIGH-WATERMARK"], offsets["LAST-STABLE"]) == ("1", "0")

    aborted = ok(cli("transactions", "abort", "--topic", "ledger", "--partition", "0", "--start-offset", "0"))
    assert f"producer {state['PRODUCER-ID']}" in aborted.out
    [offsets] = table(ok(cli("topics", "describe", "ledger")).out, "PARTITION")
    assert offsets["LAST-STABLE"] == offsets["HIGH-WATERMARK"] == "2"  # the record and the marker
    assert ok(cli("consume", "ledger", "-e", "--isolation", "read_committed")).out == ""
    assert table(ok(cli("producers", "describe", "ledger")).out, "PARTITION")[0]["TXN-START-OFFSET"] == "-"


class FakeBroker(socketserver.ThreadingTCPServer):
    """A one-node cluster answering only the transaction admin APIs, with one hanging transaction.

    It stands in for broker APIs that are still being written, and records what the CLI sent
    so the tests can check the requests themselves.
    """

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeBrokerConnection)
        self.supported = {18: (0, 3), 3: (1, 12), 10: (1, 6), 27: (1, 1), 61: (0, 0), 65: (0, 0), 66: (0, 1)}
        self.received: list = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def answer(self, api_key: int, version: int, body):
        self.received.append(body)
        schema = response_schema(api_key, version)
        answer = getattr(self, f"answer_{api_key}")
        return answer(schema, lambda entity, /, **values: make(nested(schema, entity), **values), body)

    def answer_18(self, schema, part, body):  # ApiVersions
        keys = tuple(part("ApiVersion", api_key=key, min_version=low, max_version=high)
                     for key, (low, high) in self.supported.items())
        return make(schema, error_code=ErrorCode.none, throttle_time=timedelta(0), api_keys=keys)

    def answer_3(self, schema, part, body):  # Metadata: topic "ledger" with one partition
        partition = part("MetadataResponsePartition", error_code=ErrorCode.none, partition_index=0,
                         leader_id=0, leader_epoch=0, replica_nodes=(0,), isr_nodes=(0,), offline_replicas=())
        topics = tuple(
            part("MetadataResponseTopic", name=t.name, topic_id=uuid.uuid4(), is_internal=False,
                 topic_authorized_operations=0, partitions=(partition,) if t.name == "ledger" else (),
                 error_code=ErrorCode.none if t.name == "ledger" else ErrorCode.unknown_topic_or_partition)
            for t in body.topics or ())
        host, port = self.server_address
        broker = part("MetadataResponseBroker", node_id=0, host=host, port=port, rack=None)
        return make(schema, throttle_time=timedelta(0), cluster_id="fake", controller_id=0, topics=topics,
                    brokers=(broker,))

    def answer_10(self, schema, part, body):  # FindCoordinator: this node, for every key
        host, port = self.server_address
        return make(schema, throttle_time=timedelta(0), coordinators=tuple(
            part("Coordinator", key=key, node_id=0, host=host, port=port, error_code=ErrorCode.none,
                 error_message=None) for key in body.coordinator_keys))

    def answer_61(self, schema, part, body):  # DescribeProducers
        producer = part("ProducerState", producer_id=4000, producer_epoch=7, last_sequence=0,
                        last_timestamp=1_700_000_000_000, coordinator_epoch=-1, current_txn_start_offset=5)
        partition = part("PartitionResponse", partition_index=0, error_code=ErrorCode.none, error_message=None,
                         active_producers=(producer,))
        return make(schema, throttle_time=timedelta(0),
                    topics=(part("TopicResponse", name="ledger", partitions=(partition,)),))

    def answer_27(self, schema, part, body):  # WriteTxnMarkers
        result = part("WritableTxnMarkerPartitionResult", partition_index=0, error_code=ErrorCode.none)
        topic = part("WritableTxnMarkerTopicResult", name="ledger", partitions=(result,))
        return make(schema, markers=tuple(part("WritableTxnMarkerResult", producer_id=m.producer_id,
                                               topics=(topic,)) for m in body.markers))

    def answer_66(self, schema, part, body):  # ListTransactions
        state = part("TransactionState", transactional_id="stuck", producer_id=4000, transaction_state="Ongoing")
        return make(schema, throttle_time=timedelta(0), error_code=ErrorCode.none, unknown_state_filters=(),
                    transaction_states=(state,))

    def answer_65(self, schema, part, body):  # DescribeTransactions
        [transactional_id] = body.transactional_ids
        known = transactional_id == "stuck"
        state = part("TransactionState", transactional_id=transactional_id, transaction_state="Ongoing",
                     error_code=ErrorCode.none if known else ErrorCode.transactional_id_not_found,
                     transaction_timeout=timedelta(seconds=60), producer_id=4000, producer_epoch=7,
                     transaction_start_time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc) if known
                     else datetime.fromtimestamp(-0.001, timezone.utc),  # Kafka's -1: no transaction
                     topics=(part("TopicData", topic="ledger", partitions=(0,)),) if known else ())
        return make(schema, throttle_time=timedelta(0), transaction_states=(state,))


class FakeBrokerConnection(socketserver.BaseRequestHandler):
    def handle(self):
        decoder = FrameDecoder(1 << 20)
        while data := self.request.recv(65536):
            for frame in decoder.feed(data):
                request = decode_request(frame, self.server.supported)
                response = self.server.answer(request.api_key, request.api_version, request.body)
                self.request.sendall(b"".join(encode_response(request.api_key, request.api_version,
                                                              request.correlation_id, response)))


@pytest.fixture
def fake_broker():
    server = FakeBroker()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_abort_sends_the_marker_describe_producers_found(fake_broker):
    """The kafka-transactions.sh flow: DescribeProducers, then WriteTxnMarkers(ABORT) to the leader."""
    described = ok(run_cli(fake_broker.bootstrap, "producers", "describe", "ledger"))
    assert table(described.out, "PARTITION") == [{
        "PARTITION": "0", "PRODUCER-ID": "4000", "EPOCH": "7", "LAST-SEQUENCE": "0",
        "LAST-TIMESTAMP": "1700000000000", "COORDINATOR-EPOCH": "-1", "TXN-START-OFFSET": "5"}]

    wrong = run_cli(fake_broker.bootstrap, "transactions", "abort", "--topic", "ledger", "--partition", "0",
                    "--start-offset", "4")
    assert wrong.returncode == 1 and "no open transaction starts at offset 4 on ledger-0" in wrong.err

    ok(run_cli(fake_broker.bootstrap, "transactions", "abort", "--topic", "ledger", "--partition", "0",
               "--start-offset", "5"))
    [marker] = fake_broker.received[-1].markers
    assert (marker.producer_id, marker.producer_epoch, marker.coordinator_epoch) == (4000, 7, 0)
    assert marker.transaction_result is False  # ABORT
    assert [(t.name, tuple(t.partition_indexes)) for t in marker.topics] == [("ledger", (0,))]

    explicit = ["transactions", "abort", "--topic", "ledger", "--partition", "0",
                "--producer-id", "12", "--producer-epoch", "3", "--coordinator-epoch", "9"]
    ok(run_cli(fake_broker.bootstrap, *explicit))
    [marker] = fake_broker.received[-1].markers
    assert (marker.producer_id, marker.producer_epoch, marker.coordinator_epoch) == (12, 3, 9)


def test_transactions_list_and_describe(fake_broker):
    listed = ok(run_cli(fake_broker.bootstrap, "transactions", "list", "--state", "Ongoing",
                        "--min-duration-ms", "60000"))
    assert table(listed.out, "TRANSACTIONAL-ID") == [
        {"TRANSACTIONAL-ID": "stuck", "PRODUCER-ID": "4000", "STATE": "Ongoing"}]
    request = fake_broker.received[-1]
    assert (tuple(request.state_filters), request.duration_filter) == (("Ongoing",), 60000)

    described = fields(ok(run_cli(fake_broker.bootstrap, "transactions", "describe", "stuck")).out)
    assert described == {
        "TRANSACTIONAL-ID": "stuck", "COORDINATOR": f"0 ({fake_broker.bootstrap})", "STATE": "Ongoing",
        "PRODUCER-ID": "4000", "PRODUCER-EPOCH": "7", "TIMEOUT-MS": "60000",
        "START-TIME": "2026-01-02T03:04:05.000+00:00", "PARTITIONS": "ledger-0"}
    unknown = run_cli(fake_broker.bootstrap, "transactions", "describe", "nobody")
    assert (unknown.returncode, unknown.err) == (1, "ottla: transaction 'nobody' does not exist\n")

    del fake_broker.supported[66]
    unsupported = run_cli(fake_broker.bootstrap, "transactions", "list")
    assert unsupported.returncode == 1
    assert unsupported.err == f"ottla: broker at {fake_broker.bootstrap} does not support ListTransactions\n"
