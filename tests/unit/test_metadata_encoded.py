"""Metadata reuses each topic's encoded part until the metadata cache changes: the bytes must
be exactly kio's encoding of the same answer, for every version, and a change (a new leader,
a broker gone) must show in the very next answer."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from ottla.protocol.build import make
from ottla.protocol.codec import decode_response, encode_response
from ottla.protocol.schemas import request_schema, response_schema
from ottla.server.context import RequestContext
from ottla.server.handlers import metadata
from ottla.server.metadata_cache import BrokerInfo, MetadataCache, PartitionState

BROKERS = [BrokerInfo(b, f"broker-{b}", 9090 + b, rack=f"r{b}") for b in (1, 2, 3)]
IDS = {"big": uuid.UUID(int=1), "small": uuid.UUID(int=2), "__consumer_offsets": uuid.UUID(int=3)}


class AllowAll:
    def authorize(self, principal, operation, resource):
        return True


def replicas(p):
    return tuple((p + k) % 3 + 1 for k in range(3))


def cache() -> MetadataCache:
    states = [PartitionState("big", p, replicas(p)[0], 5, replicas(p), replicas(p)[:2], zk_version=p)
              for p in range(40)]
    states += [PartitionState("small", 0, 2, 0, (2, 3), (2,), offline_replicas=(3,)),
               PartitionState("__consumer_offsets", 0, 1, 1, (1,), (1,))]
    metadata_cache = MetadataCache(1, "cluster-x")
    metadata_cache.update(controller_id=2, controller_epoch=1, brokers=BROKERS, partition_states=states,
                          topic_ids=IDS, full=True)
    return metadata_cache


def ask(metadata_cache, version, names=None, operations=False):
    """(the frame Ottla sends, the response decoded from it)."""
    broker = SimpleNamespace(metadata=metadata_cache, config={"auto.create.topics.enable": False},
                             membership=None, authorizer=AllowAll())
    ctx = RequestContext(broker, metadata.API_KEY, version, None, "c1")
    request_type = request_schema(metadata.API_KEY, version)
    topic_type = getattr(__import__(request_type.__module__, fromlist=["x"]), "MetadataRequestTopic")
    topics = [] if version == 0 and names is None else None if names is None else \
        [make(topic_type, name=name, topic_id=None) for name in names]
    request = make(request_type, topics=topics, allow_auto_topic_creation=False,
                   include_topic_authorized_operations=operations, include_cluster_authorized_operations=operations)
    response = asyncio.run(metadata.handle(ctx, request))
    frame = b"".join(bytes(c) for c in encode_response(metadata.API_KEY, version, 9, response))[4:]
    return frame, decode_response(frame, metadata.API_KEY, version)[1]


@pytest.mark.parametrize("version", range(metadata.VERSIONS[0], metadata.VERSIONS[1] + 1))
def test_reused_topic_parts_encode_exactly_as_kio_does(version):
    metadata_cache = cache()
    for names, operations in ((None, False), (["small", "nope", "big"], False), (None, True)):
        for _ in range(2):  # the second answer comes from the reused parts
            frame, decoded = ask(metadata_cache, version, names, operations)
            assert frame == b"".join(bytes(c) for c in encode_response(metadata.API_KEY, version, 9, decoded))[4:]
            by_name = {t.name: t for t in decoded.topics}
            assert list(by_name) == (names or ["__consumer_offsets", "big", "small"])
            big = by_name["big"]
            assert [(p.partition_index, p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes)) for p in big.partitions] \
                == [(p, replicas(p)[0], replicas(p), replicas(p)[:2]) for p in range(40)]
            if version >= 7:
                assert {p.leader_epoch for p in big.partitions} == {5}
            if names:
                assert by_name["nope"].error_code == 3 and not by_name["nope"].partitions
            if version >= 8:
                assert (big.topic_authorized_operations > 0) == operations


def test_a_leader_change_or_a_broker_gone_shows_in_the_next_answer():
    metadata_cache = cache()
    assert ask(metadata_cache, 12)[1].topics[1].partitions[0].leader_id == 1  # big-0, now reused
    metadata_cache.update_from_leader_and_isr([PartitionState("big", 0, 2, 6, replicas(0), (2, 3))])
    big = ask(metadata_cache, 12)[1].topics[1]
    assert (big.partitions[0].leader_id, big.partitions[0].leader_epoch, tuple(big.partitions[0].isr_nodes)) == (2, 6, (2, 3))

    metadata_cache.update(controller_id=2, controller_epoch=1, brokers=BROKERS[1:], partition_states=[],
                          topic_ids={})  # broker 1 gone, nothing else changed
    big = ask(metadata_cache, 12)[1].topics[1]
    assert big.partitions[1].leader_id == 2
    assert big.partitions[3].leader_id == -1 and big.partitions[3].error_code == 5  # led by broker 1
    assert ask(metadata_cache, 11)[1].topics[1].partitions[3].leader_id == -1

    metadata_cache.local_remove("small")
    assert [t.name for t in ask(metadata_cache, 12)[1].topics] == ["__consumer_offsets", "big"]
