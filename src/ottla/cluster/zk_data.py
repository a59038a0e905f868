"""Kafka's ZooKeeper layout (`ZkData`): the znode paths and the JSON each one holds.

Byte-for-byte what Kafka writes, so Kafka's tools read an Ottla cluster's ZooKeeper and
the other way round. Pure functions; `zk.py` does the I/O.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any, Mapping

from .store import BrokerRegistration, LeaderAndIsr, TopicAssignment

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
CONFIG_CHANGES = "/config/changes"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN = "/admin/reassign_partitions"
PREFERRED_ELECTION = "/admin/preferred_replica_election"
ISR_CHANGES = "/isr_change_notification"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
# Kafka's ZkData.PersistentZkPaths (plus ConfigType.all), created at start-up if missing.
PERSISTENT_PATHS = ("/consumers", BROKER_IDS, TOPICS, CONFIG_CHANGES, DELETE_TOPICS, "/brokers/seqid",
                    ISR_CHANGES, PRODUCER_ID_BLOCK, "/log_dir_event_notification", "/config/topics",
                    "/config/clients", "/config/users", "/config/brokers", "/config/ips")
INITIAL_CONTROLLER_EPOCH = 0  # Kafka's KafkaController.InitialControllerEpoch


def to_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def now_ms() -> str:
    return str(int(time.time() * 1000))


def topic_id_to_str(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def topic_id_from_str(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def partition_list(partitions) -> list[dict]:
    return [{"topic": t, "partition": p} for t, p in sorted(partitions)]


def encode_broker(reg: BrokerRegistration) -> bytes:
    """Kafka's BrokerIdZNode JSON, version 5 (no JMX, no features)."""
    data = {"features": {}, "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
            "endpoints": [f"PLAINTEXT://{reg.host}:{reg.port}"], "jmx_port": -1,
            "host": reg.host, "port": reg.port, "timestamp": now_ms(), "version": 5}
    if reg.rack is not None:
        data["rack"] = reg.rack
    return to_json(data)


def decode_broker(broker_id: int, raw: bytes, czxid: int) -> BrokerRegistration:
    data = json.loads(raw)
    host, port = data.get("host"), data.get("port", -1)
    for endpoint in data.get("endpoints", ()):
        if endpoint.startswith("PLAINTEXT://"):
            host, _, port_text = endpoint[len("PLAINTEXT://"):].rpartition(":")
            port = int(port_text)
            break
    return BrokerRegistration(broker_id, host, int(port), data.get("rack"), czxid)


def encode_assignment(a: TopicAssignment) -> bytes:
    """Kafka's TopicZNode JSON, version 3."""
    def replicas(m):
        return {str(p): list(r) for p, r in sorted(m.items())}
    return to_json({"partitions": replicas(a.partitions), "topic_id": topic_id_to_str(a.topic_id),
                  "adding_replicas": replicas(a.adding_replicas),
                  "removing_replicas": replicas(a.removing_replicas), "version": 3})


def decode_assignment(name: str, raw: bytes) -> TopicAssignment:
    data = json.loads(raw)

    def replicas(key):
        return {int(p): tuple(r) for p, r in (data.get(key) or {}).items()}
    # A topic written by a pre-2.8 tool has no id; the controller gives it one on next write.
    topic_id = topic_id_from_str(data["topic_id"]) if data.get("topic_id") else uuid.UUID(int=0)
    return TopicAssignment(name, topic_id, replicas("partitions"), replicas("adding_replicas"),
                           replicas("removing_replicas"))


def encode_state(s: LeaderAndIsr) -> bytes:
    return to_json({"controller_epoch": s.controller_epoch, "leader": s.leader, "version": 1,
                  "leader_epoch": s.leader_epoch, "isr": list(s.isr)})


def decode_state(raw: bytes, version: int) -> LeaderAndIsr:
    data = json.loads(raw)
    return LeaderAndIsr(data["leader"], data["leader_epoch"], tuple(data["isr"]), data["controller_epoch"], version)


CONFIG_CHANGE_PREFIX = "config_change_"


def decode_config_change(raw: bytes) -> str:
    """The entity a `/config/changes` notification names ("topics/<t>", "brokers/<id>"):
    version 2 gives its path, Kafka's older version 1 its type and name."""
    data = json.loads(raw)
    if data.get("version") == 1:
        return f"{data['entity_type']}/{data['entity_name']}"
    return str(data["entity_path"])


def config_bytes(configs: Mapping[str, str]) -> bytes:
    return to_json({"version": 1, "config": {k: str(v) for k, v in configs.items()}})


def split_chroot(connect: str) -> tuple[str, str | None]:
    hosts, slash, chroot = connect.partition("/")
    return hosts, ("/" + chroot.rstrip("/")) if slash and chroot.strip("/") else None
