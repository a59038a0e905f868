"""The demo's verifier: reads both topics with plain confluent-kafka consumers (not the Spark source) and
checks that the output is exactly one correctly enriched record per committed payment.

The expected enrichment is computed here in plain Python, independently of the Spark SQL in
`query.enrich`: if either is wrong, the values differ.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ..end_offsets import list_offsets

TIMEOUT_S = 120.0


def expected_output(event: dict, topic: str, partition: int, offset: int) -> dict:
    cents = event["amount_cents"]
    fee = (cents * 15 + 500) // 1000 + 30  # 1.5% rounded half up, plus 30 cents
    band = "small" if cents < 1_000 else "medium" if cents < 100_000 else "large"
    return {"id": event["id"], "account": event["account"], "currency": event["currency"],
            "amount": f"{cents // 100}.{cents % 100:02d}", "fee_cents": fee, "net_cents": cents - fee,
            "band": band, "source": f"{topic}-{partition}@{offset}"}


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass
class Report:
    records_in: int = 0
    records_out: int = 0
    duplicates: int = 0
    missing: int = 0
    leaked: int = 0
    wrong: int = 0
    unexpected: int = 0
    input_duplicates: int = 0
    aborted_in_log: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return (self.records_in == self.records_out and not (self.duplicates or self.missing or self.leaked or
                self.wrong or self.unexpected or self.input_duplicates))

    def note(self, message: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(message)


def compare(topic: str, committed: list[Record], aborted_ids: set[str], output: list[Record]) -> Report:
    """`committed`: the input topic read read_committed; `aborted_ids`: payments of aborted transactions;
    `output`: the output topic read read_committed."""
    report = Report(records_in=len(committed), records_out=len(output))
    expected = {}
    for record in committed:
        event = json.loads(record.value)
        if event["id"] in expected:
            report.input_duplicates += 1
            report.note(f"payment {event['id']} is committed twice in the input")
        expected[event["id"]] = expected_output(event, topic, record.partition, record.offset)
    seen = Counter()
    for record in output:
        value = json.loads(record.value)
        ident = value.get("id")
        seen[ident] += 1
        if ident in aborted_ids and ident not in expected:
            report.leaked += 1
            report.note(f"{ident} comes from an aborted transaction")
        elif ident not in expected:
            report.unexpected += 1
            report.note(f"output record {record.partition}@{record.offset} is no committed payment: {value}")
        elif value != expected[ident] or record.key != ident.encode():
            report.wrong += 1
            report.note(f"{ident}: got key {record.key!r} value {value}, expected {expected[ident]}")
    report.duplicates = sum(count - 1 for count in seen.values() if count > 1)
    report.missing = sum(1 for ident in expected if ident not in seen)
    for ident, count in seen.items():
        if count > 1:
            report.note(f"{ident} is in the output {count} times")
    return report


def wait_until_stable(bootstrap: str, topic: str, timeout_s: float = TIMEOUT_S) -> None:
    """Wait until no transaction is open on the topic (LSO = high watermark), so read_committed reads all."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    deadline = time.monotonic() + timeout_s
    while True:
        ends = {}
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            answers = list_offsets(admin, {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                   isolation_level=level, timeout_s=30)
            ends[level] = {tp.partition: info.offset for tp, info in answers.items()}
        if ends[IsolationLevel.READ_COMMITTED] == ends[IsolationLevel.READ_UNCOMMITTED]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: transactions still open after {timeout_s:.0f}s: "
                               f"LSO {ends[IsolationLevel.READ_COMMITTED]}, "
                               f"high watermark {ends[IsolationLevel.READ_UNCOMMITTED]}")
        time.sleep(0.5)


def read_all(bootstrap: str, topic: str, *, committed: bool = True) -> list[Record]:
    """Every record of the topic from offset 0 to the end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-verifier", "enable.auto.commit": False,
                         "enable.partition.eof": True, "log_level": 0,
                         "isolation.level": "read_committed" if committed else "read_uncommitted"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records, at_end = [], set()
        deadline = time.monotonic() + TIMEOUT_S
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end in {TIMEOUT_S:.0f}s")
            for msg in consumer.consume(10_000, timeout=0.5):
                error = msg.error()
                if error is None:
                    records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                elif not error.retriable():
                    raise KafkaException(error)
        return records
    finally:
        consumer.close()


def verify(bootstrap: str, input_topic: str, output_topic: str, aborted_ids: set[str]) -> Report:
    for topic in (input_topic, output_topic):
        wait_until_stable(bootstrap, topic)
    committed = read_all(bootstrap, input_topic)
    everything = read_all(bootstrap, input_topic, committed=False)
    committed_ids = {json.loads(r.value)["id"] for r in committed}
    in_log_aborted = {json.loads(r.value)["id"] for r in everything} - committed_ids
    report = compare(input_topic, committed, aborted_ids | in_log_aborted, read_all(bootstrap, output_topic))
    report.aborted_in_log = len(in_log_aborted)
    return report
