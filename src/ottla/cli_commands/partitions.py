"""Partition state as the Metadata response gives it (leader epoch, ISR and offline replicas,
which librdkafka does not expose), for `topics describe` and `cluster describe`."""

from __future__ import annotations

from dataclasses import dataclass

UNDER_REPLICATED = "under-replicated"
OFFLINE = "offline"


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]

    @property
    def status(self) -> str | None:
        """Kafka's kafka-topics filters: no live leader is unavailable (offline); an ISR smaller
        than the replicas is under-replicated."""
        if self.leader < 0:
            return OFFLINE
        if len(self.isr) < len(self.replicas):
            return UNDER_REPLICATED
        return None


def _ids(ids) -> str | None:
    return ",".join(str(i) for i in ids) or None


def states_of(response) -> list[PartitionState]:
    return sorted((PartitionState(topic.name, p.partition_index, p.leader_id, p.leader_epoch,
                                  tuple(p.replica_nodes), tuple(p.isr_nodes), tuple(p.offline_replicas))
                   for topic in response.topics for p in topic.partitions),
                  key=lambda state: (state.topic, state.partition))


def partition_states(client, topic: str) -> list[PartitionState]:
    """One topic's partitions; a topic error raises as the protocol client reports it."""
    client.metadata([topic])  # raises "topic ... does not exist" and other topic errors
    return states_of(client.metadata_response([topic]))
