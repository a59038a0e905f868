"""KIP-951 leader hints from the metadata cache: which refusals get them, which versions carry
them, and endpoints only for live leaders, each named once."""

import uuid

from kio.schema.fetch.v12 import response as fetch12
from kio.schema.fetch.v16 import response as fetch16
from kio.schema.produce.v9 import response as produce9
from kio.schema.produce.v11 import response as produce11

from ottla.errors import ErrorCode
from ottla.server.leader_hints import LeaderHints
from ottla.server.metadata_cache import BrokerInfo, MetadataCache, PartitionState


def _cache() -> MetadataCache:
    cache = MetadataCache(node_id=1, cluster_id="c")
    states = [PartitionState("t", 0, 2, 7, (1, 2), (1, 2)), PartitionState("t", 1, 2, 4, (1, 2), (1, 2)),
              PartitionState("t", 2, 3, 5, (1, 3), (1, 3))]  # broker 3 is not alive
    brokers = [BrokerInfo(1, "h1", 9091), BrokerInfo(2, "h2", 9092, "r2")]
    cache.update(controller_id=1, controller_epoch=1, brokers=brokers, partition_states=states,
                 topic_ids={"t": uuid.uuid4()}, full=True)
    return cache


def test_refusals_name_the_leader_and_list_live_endpoints_once():
    hints = LeaderHints(_cache(), produce11.ProduceResponse)
    first = hints.current_leader("t", 0, ErrorCode.not_leader_or_follower)["current_leader"]
    second = hints.current_leader("t", 1, ErrorCode.fenced_leader_epoch)["current_leader"]
    offline = hints.current_leader("t", 2, ErrorCode.not_leader_or_follower)["current_leader"]
    assert (first.leader_id, first.leader_epoch, second.leader_epoch) == (2, 7, 4)
    assert (offline.leader_id, offline.leader_epoch) == (3, 5)
    assert hints.current_leader("t", 0, ErrorCode.none) == {}
    assert hints.current_leader("t", 0, ErrorCode.unknown_topic_or_partition) == {}
    unknown = hints.current_leader("gone", 0, ErrorCode.not_leader_or_follower)["current_leader"]
    assert (unknown.leader_id, unknown.leader_epoch) == (-1, -1)
    assert [(n.node_id, n.host, n.port, n.rack) for n in hints.node_endpoints()] == [(2, "h2", 9092, "r2")]


def test_versions_without_the_fields_get_nothing():
    for response_type in (produce9.ProduceResponse, fetch12.FetchResponse):
        hints = LeaderHints(_cache(), response_type)
        assert hints.current_leader("t", 0, ErrorCode.not_leader_or_follower) == {}
        assert hints.node_endpoints() == ()
    hints = LeaderHints(_cache(), fetch16.FetchResponse)
    assert hints.current_leader("t", 0, ErrorCode.not_leader_or_follower)["current_leader"].leader_id == 2
