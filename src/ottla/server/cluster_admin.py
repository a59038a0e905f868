"""Topic admin in a cluster: CreateTopics, CreatePartitions and DeleteTopics through the store.

The checks and the replica assignment are `controller.admin`'s (Kafka's `AdminZkClient`);
this adds what the handlers need around them: store calls off the event loop, and the
wait Kafka's `DelayedCreatePartitions` / `DelayedDeleteTopics` do, until this broker's
metadata shows the change (leaders elected, or the topic gone), up to the request's
timeout (REQUEST_TIMED_OUT past it; the change itself still happens).
"""

from __future__ import annotations

import asyncio
import uuid

from ..config import ConfigError, validate_topic_configs
from ..controller import admin
from ..errors import ErrorCode, KafkaError
from ..log.manager import validate_topic_name

__all__ = ["create_topic", "auto_create_topic", "create_partitions", "delete_topic"]

POLL_S = 0.05


async def _wait(condition, timeout_ms: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_ms, 0) / 1000
    while not condition():
        if loop.time() >= deadline:
            raise KafkaError(ErrorCode.request_timed_out, "The controller has not propagated the change yet.")
        await asyncio.sleep(POLL_S)


def _led(broker, name: str, count: int) -> bool:
    info = broker.metadata.topic(name)
    return (info is not None and info.partition_count >= count
            and all(broker.metadata.leader(name, p) is not None for p in range(count)))


async def create_topic(broker, topic, *, validate_only: bool, timeout_ms: int) -> tuple[uuid.UUID, int, int, dict]:
    """One CreatableTopic; returns (topic id, partitions, replication factor, configs)."""
    validate_topic_name(topic.name)
    assignment = None
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "Both numPartitions or replicationFactor and replicasAssignments were set.")
        assignment = {a.partition_index: tuple(a.broker_ids) for a in topic.assignments}
    count = broker.config["num.partitions"] if topic.num_partitions == -1 else topic.num_partitions
    factor = broker.config["default.replication.factor"] if topic.replication_factor == -1 else topic.replication_factor
    try:
        configs = validate_topic_configs({c.name: c.value for c in topic.configs})
    except ConfigError as exc:
        raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
    store = broker.membership.store
    planned = await asyncio.to_thread(admin.plan_topic, store, topic.name, count, factor, assignment)
    replicas = next(iter(planned.partitions.values()))
    if not validate_only:
        await asyncio.to_thread(admin.create_topic, store, planned, {c.name: c.value for c in topic.configs})
        await _wait(lambda: _led(broker, topic.name, len(planned.partitions)), timeout_ms)
    return planned.topic_id, len(planned.partitions), len(replicas), configs


async def auto_create_topic(broker, name: str) -> ErrorCode:
    """Metadata's auto-creation in a cluster, as Kafka's ZooKeeper mode does it: the topic goes
    to the store with `num.partitions` and `default.replication.factor`, the controller
    assigns leaders, and the client is told LEADER_NOT_AVAILABLE (retriable) meanwhile."""
    store = broker.membership.store

    def create() -> None:
        planned = admin.plan_topic(store, name, broker.config["num.partitions"],
                                   broker.config["default.replication.factor"])
        admin.create_topic(store, planned, {})
    try:
        validate_topic_name(name)
        await asyncio.to_thread(create)
    except KafkaError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            return exc.code
    return ErrorCode.leader_not_available


async def create_partitions(broker, name: str, count: int, assignments, *, validate_only: bool,
                            timeout_ms: int) -> None:
    store = broker.membership.store
    replicas = None if assignments is None else [tuple(a.broker_ids) for a in assignments]
    await asyncio.to_thread(lambda: admin.create_partitions(store, name, count, replicas, validate_only=validate_only))
    if not validate_only:
        await _wait(lambda: _led(broker, name, count), timeout_ms)


async def delete_topic(broker, name: str, *, timeout_ms: int) -> None:
    await asyncio.to_thread(admin.delete_topic, broker.membership.store, name)
    await _wait(lambda: not broker.metadata.has_topic(name), timeout_ms)
