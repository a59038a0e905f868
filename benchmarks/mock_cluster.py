"""Run librdkafka's in-memory mock cluster (one broker) in this process.

Prints ``bootstrap HOST:PORT``, then reads ``TOPIC PARTITIONS`` lines from stdin and answers
``created TOPIC`` for each. Exits when stdin closes, so it never outlives the benchmark.

The mock is created through the C API of the librdkafka that confluent-kafka bundles (ctypes),
because only that API can create topics with a chosen partition count: the mock does not
implement CreateTopics and auto-creates topics with 4 partitions. Note that the mock keeps at
most ~5 MiB per partition; older batches are dropped.

Run it by hand to point a client at a mock: ``python benchmarks/mock_cluster.py``.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import confluent_kafka

RD_KAFKA_PRODUCER = 0


def _librdkafka() -> ctypes.CDLL:
    package = Path(confluent_kafka.__file__).resolve().parent
    candidates = sorted(package.parent.glob("confluent_kafka.libs/librdkafka*.so*"))
    lib = ctypes.CDLL(str(candidates[0]) if candidates else "librdkafka.so.1")
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    return lib


def main() -> None:
    lib = _librdkafka()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    # The handle only hosts the mock; silence its "no bootstrap.servers" warning.
    lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
    handle = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
    if not handle:
        sys.exit(f"rd_kafka_new failed: {errstr.value.decode()}")
    cluster = lib.rd_kafka_mock_cluster_new(handle, 1)
    print("bootstrap", lib.rd_kafka_mock_cluster_bootstraps(cluster).decode(), flush=True)
    for line in sys.stdin:
        topic, partitions = line.split()
        err = lib.rd_kafka_mock_topic_create(cluster, topic.encode(), int(partitions), 1)
        if err:
            sys.exit(f"creating {topic} failed with librdkafka error {err}")
        print("created", topic, flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
