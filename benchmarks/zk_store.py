"""What the ZooKeeper cluster store costs: one standalone ZooKeeper on loopback (Debian's jars).

    PYTHONPATH=src python benchmarks/zk_store.py [--partitions 1000]

Prints a table: latency of the calls the controller and brokers make, the time to read
the whole metadata of a topic with --partitions partitions (a controller's start-up reads
every partition state once), and to write a new leader for each of them, one write at a
time and pipelined.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from ottla.cluster.store import LeaderAndIsr, TopicAssignment
from ottla.cluster.zk import ZkClusterStore
from ottla.testing.zookeeper import zookeeper


def timed(fn, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    rows = []
    with zookeeper() as server:
        store = ZkClusterStore(server.connect, session_timeout_ms=6000)
        try:
            epoch = store.elect_controller(1)
            store.create_topic(TopicAssignment("small", uuid.uuid4(), {0: (1, 2, 3)}), {})
            state = store.create_partition_states({("small", 0): LeaderAndIsr(1, 0, (1, 2, 3), 1)}, epoch)[("small", 0)]

            def fenced_update():
                nonlocal state
                state = store.update_partition_state(("small", 0), LeaderAndIsr(1, state.leader_epoch + 1, (1, 2, 3), 1,
                                                                                 state.version), epoch)

            rows.append(("controller_id (1 get)", timed(store.controller_id, args.repeat)))
            rows.append(("update_partition_state, fenced multi", timed(fenced_update, args.repeat)))
            rows.append(("claim_producer_id_block", timed(lambda: store.claim_producer_id_block(1, 1000), args.repeat)))
            rows.append(("notify_isr_change", timed(lambda: store.notify_isr_change({("small", 0)}), args.repeat)))

            n = args.partitions
            big = TopicAssignment("big", uuid.uuid4(), {p: (p % 3 + 1, (p + 1) % 3 + 1, (p + 2) % 3 + 1) for p in range(n)})
            started = time.perf_counter()
            store.create_topic(big, {})
            store.create_partition_states({("big", p): LeaderAndIsr(p % 3 + 1, 0, big.partitions[p], 1)
                                           for p in range(n)}, epoch)
            create_ms = (time.perf_counter() - started) * 1000
            rows.append((f"create topic + {n} partition states (one fenced multi)", [create_ms]))
            rows.append((f"topics() with {n + 1} partitions", timed(store.topics, 5)))
            rows.append((f"partition_states('big'), {n} partitions", timed(lambda: store.partition_states("big"), 3)))

            # An election for every partition (what a broker failure asks for a third of them):
            # one fenced, version-conditional write per partition, one at a time, then pipelined.
            states = store.partition_states("big")

            def elect(p: int) -> LeaderAndIsr:
                s = states[p]
                return LeaderAndIsr(s.leader % 3 + 1, s.leader_epoch + 1, s.isr, 1, s.version)
            started = time.perf_counter()
            for p in range(n):
                states[p] = store.update_partition_state(("big", p), elect(p), epoch)
            rows.append((f"{n} partition states updated one at a time", [(time.perf_counter() - started) * 1000]))
            started = time.perf_counter()
            written = store.update_partition_states({("big", p): elect(p) for p in range(n)}, epoch)
            rows.append((f"{n} partition states, update_partition_states (pipelined)",
                         [(time.perf_counter() - started) * 1000]))
            assert all(isinstance(w, LeaderAndIsr) for w in written.values())
        finally:
            store.close()
    print(f"{'operation':<60} {'median ms':>10} {'p99 ms':>10} {'n':>5}")
    for name, samples in rows:
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"{name:<60} {statistics.median(samples):>10.2f} {p99:>10.2f} {len(samples):>5}")


if __name__ == "__main__":
    main()
