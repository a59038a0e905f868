"""Checks on a real cluster shared by the process-level tests: what Metadata says about a
partition, and a partition's batches read straight from a broker's segment files, so that
replicas can be compared batch by batch below the high watermark."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ottla.records.batch import read_header


def partition_info(bootstrap: str, topic: str, partition: int = 0):
    """(leader, replicas, isr) as Metadata answers, or None."""
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    except KafkaException:
        return None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or partition not in info.partitions:
        return None
    p = info.partitions[partition]
    return p.leader, tuple(p.replicas), tuple(sorted(p.isrs))


def segment_batches(data_dir: Path, topic: str, below: int, partition: int = 0) -> list[bytes]:
    """The batches of the partition's segment files that start below offset `below`, as bytes,
    in offset order (read while the broker runs: an active segment may be pre-allocated past
    its last batch, so the walk stops there)."""
    out = []
    for segment in sorted((data_dir / f"{topic}-{partition}").glob("*.log")):
        buf = segment.read_bytes()
        position = 0
        while position + 61 <= len(buf):
            header = read_header(buf, position)
            if header.batch_length <= 0 or header.base_offset >= below:
                break
            out.append(buf[position:position + 12 + header.batch_length])
            position += 12 + header.batch_length
    return out


def base_offset(batch: bytes) -> int:
    return int.from_bytes(batch[:8], "big")
