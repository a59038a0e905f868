"""What KIP-890's verification costs a transactional produce on three brokers (a real ZooKeeper,
`ottla.testing.cluster`): the data partition is led by broker 1, the transactional id's
coordinator is broker 3, so a write the partition leader must verify costs it an
AddPartitionsToTxn v4 round trip to broker 3 before the append.

One confluent-kafka transactional producer (transactions version 1, acks=all, linger.ms 0)
writes `--records` records per transaction, one Produce each (flush() after every record), for
`--transactions` transactions; the table gives the produce latency (send to acknowledgement)
of a transaction's first write, which is always verified, and of its later writes, which
Kafka does not verify once the partition's log holds the transaction
(`UnifiedLog.maybeStartTransactionVerification`).

    PYTHONPATH=src python benchmarks/txn_verification.py [--records 200] [--transactions 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ottla.coordinator.partitioning import partition_for
from ottla.testing import cluster

PARTITIONS = 6
CONFIG = {"transaction.state.log.num.partitions": PARTITIONS, "transaction.state.log.replication.factor": 1,
          "offsets.topic.num.partitions": PARTITIONS, "offsets.topic.replication.factor": 1}


def _leaders(admin, topic, count) -> dict[int, int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = admin.list_topics(topic, timeout=20).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == count and all(
                p.leader >= 0 for p in found.partitions.values()):
            return {index: p.leader for index, p in found.partitions.items()}
        time.sleep(0.2)
    raise TimeoutError(f"{topic} not led")


def _transactional_id(three, admin) -> str:
    """An id whose `__transaction_state` partition broker 3 leads (the first InitProducerId
    of any id creates the topic)."""
    warm = Producer({"bootstrap.servers": three.bootstrap, "transactional.id": "warm-up"})
    warm.init_transactions(120)
    led = _leaders(admin, "__transaction_state", PARTITIONS)
    return next(k for k in (f"bench-{i}" for i in range(10_000)) if led[partition_for(k, PARTITIONS)] == 3)


def run(records: int, transactions: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="txnverify-") as root, \
            cluster(brokers=3, config=CONFIG, root=Path(root)) as three:
        admin = AdminClient({"bootstrap.servers": three.bootstrap})
        admin.create_topics([NewTopic("bench", 3, 1)])["bench"].result(60)
        partition = next(p for p, b in _leaders(admin, "bench", 3).items() if b == 1)
        producer = Producer({"bootstrap.servers": three.bootstrap, "transactional.id": _transactional_id(three, admin),
                             "linger.ms": 0, "acks": "all"})
        producer.init_transactions(60)
        latencies: dict[str, list[float]] = {"first write": [], "later writes": []}
        for _ in range(transactions):
            producer.begin_transaction()
            for i in range(records):
                started = time.perf_counter()
                producer.produce("bench", b"x" * 100, partition=partition)
                producer.flush(30)
                latencies["first write" if i == 0 else "later writes"].append((time.perf_counter() - started) * 1000)
            producer.commit_transaction(60)
        return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--transactions", type=int, default=5)
    args = parser.parse_args()
    latencies = run(args.records, args.transactions)
    print("| writes | count | p50 ms | p90 ms |")
    print("|---|---:|---:|---:|")
    for name, values in latencies.items():
        values.sort()
        print(f"| {name} | {len(values)} | {statistics.median(values):.2f} | {values[int(len(values) * 0.9)]:.2f} |")


if __name__ == "__main__":
    main()
