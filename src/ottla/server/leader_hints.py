"""KIP-951 leader discovery: a Produce (v10+) or Fetch (v16+) answered NOT_LEADER_OR_FOLLOWER or
FENCED_LEADER_EPOCH names the partition's current leader and epoch, and the response lists
the endpoints of the leaders it names, so the client goes to the new leader at once instead
of waiting for its next Metadata refresh (librdkafka re-asks about once a second).

The leader comes from the metadata cache, what this broker has been told by the controller
(UpdateMetadata, and LeaderAndIsr for the partitions it hosts), as Kafka's
`KafkaApis.getCurrentLeader` falls back to; an endpoint is only given for a live leader.
"""

from __future__ import annotations

from ..errors import ErrorCode
from ..protocol.build import make, nested

HINTED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})


class LeaderHints:
    """Collects, for one response, the `current_leader` of each refused partition and the
    `node_endpoints` of the leaders named. Does nothing for versions without the fields
    (the response schema has no `NodeEndpoint`: Produce v0-9, Fetch v0-15)."""

    def __init__(self, metadata, response_type):
        self._metadata = metadata
        self._endpoint_type = nested(response_type, "NodeEndpoint")
        self._leader_type = nested(response_type, "LeaderIdAndEpoch")
        self._endpoints: dict[int, object] = {}

    def current_leader(self, topic: str | None, partition: int, error) -> dict:
        """`{"current_leader": ...}` to add to a partition's response, or `{}`."""
        if self._endpoint_type is None or error not in HINTED or topic is None:
            return {}
        state = self._metadata.partition(topic, partition)
        if state is None:
            return {"current_leader": make(self._leader_type, leader_id=-1, leader_epoch=-1)}
        broker = self._metadata.broker(state.leader)
        if broker is not None:
            self._endpoints[broker.node_id] = make(self._endpoint_type, node_id=broker.node_id, host=broker.host,
                                                   port=broker.port, rack=broker.rack)
        return {"current_leader": make(self._leader_type, leader_id=state.leader, leader_epoch=state.leader_epoch)}

    def node_endpoints(self) -> tuple:
        return tuple(self._endpoints[node_id] for node_id in sorted(self._endpoints))
