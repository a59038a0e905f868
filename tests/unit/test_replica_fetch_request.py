"""The replica fetcher's hand-encoded Fetch v12 (`protocol/replica_fetch.py`) is byte for byte
what kio writes for the same values, and the broker's own request decoder reads it back."""

from datetime import timedelta

import pytest
from kio.schema.fetch.v12 import request as kio_fetch

from ottla.protocol.codec import decode_request, encode_request
from ottla.protocol.replica_fetch import FetchedPartition, ReplicaFetchRequest

TOPICS = [
    (),
    (("t", ()),),
    (("wide", tuple(FetchedPartition(p, 7, 10 ** 12 + p, -1 if p % 2 else 6, p, 1 << 20) for p in range(300))),),
    (("ä-topic" * 20, (FetchedPartition(0, -1, 0, -1, 0, 0),)),
     ("b", (FetchedPartition(2 ** 31 - 1, 2 ** 31 - 1, 2 ** 63 - 1, 2 ** 31 - 1, 2 ** 63 - 1, 2 ** 31 - 1),))),
]


def _kio(request: ReplicaFetchRequest) -> kio_fetch.FetchRequest:
    return kio_fetch.FetchRequest(
        cluster_id=None, replica_id=request.replica_id, max_wait=timedelta(milliseconds=request.max_wait_ms),
        min_bytes=request.min_bytes, max_bytes=request.max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
        topics=tuple(kio_fetch.FetchTopic(topic=topic, partitions=tuple(
            kio_fetch.FetchPartition(partition=p.partition, current_leader_epoch=p.current_leader_epoch,
                                     fetch_offset=p.fetch_offset, last_fetched_epoch=p.last_fetched_epoch,
                                     log_start_offset=p.log_start_offset, partition_max_bytes=p.partition_max_bytes)
            for p in partitions)) for topic, partitions in request.topics),
        forgotten_topics_data=(), rack_id="")


@pytest.mark.parametrize("topics", TOPICS)
@pytest.mark.parametrize("client_id", ["ottla-broker-1", None, ""])
def test_same_bytes_as_kio(topics, client_id):
    request = ReplicaFetchRequest(replica_id=3, max_wait_ms=500, min_bytes=1, max_bytes=10 << 20, topics=topics)
    ours = encode_request(request, 123456, client_id)
    assert ours == encode_request(_kio(request), 123456, client_id)
    decoded = decode_request(ours[4:], {1: (12, 12)})
    assert decoded.body == _kio(request)
