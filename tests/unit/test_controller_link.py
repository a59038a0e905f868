"""The broker's side of LeaderAndIsr over a real connection to a real `Broker`: the controller's
connection closing mid-request does not leave the request half applied."""

import asyncio
import socket
import uuid

from ottla.cluster.memory_store import MemoryStore, MemoryZooKeeper
from ottla.cluster.store import TopicAssignment
from ottla.config import BrokerConfig
from ottla.controller import wire
from ottla.controller.requests import ControllerRequest, LeaderAndIsrPayload, PartitionState
from ottla.protocol.schemas import request_schema
from ottla.server.broker import Broker
from ottla.server.controller_link import ControllerLink
from ottla.testing.fuzz import encode

PARTITIONS = 300  # three of the replica manager's slices, each a loop step of its own


def leader_and_isr(node_id: int, partitions: int, topic_id: uuid.UUID) -> bytes:
    payload = LeaderAndIsrPayload(
        controller_id=node_id + 1, controller_epoch=1, broker_epoch=-1,
        partitions=tuple(PartitionState("big", p, 1, node_id, 1, (node_id,), 0, (node_id,), is_new=True)
                         for p in range(partitions)),
        topic_ids={"big": topic_id}, live_leaders=())
    api_key, version, message = wire.to_message(ControllerRequest(node_id, "LeaderAndIsr", payload))
    assert type(message) is request_schema(api_key, version)
    return encode(message, 1, client_id=f"broker-{node_id + 1}-controller")


def test_a_leader_and_isr_whose_controller_connection_closes_is_applied_whole(tmp_path):
    """The network layer cancels a request's handler when its connection closes. A LeaderAndIsr
    creates the new topic's logs in worker threads and takes the roles 100 partitions per loop
    step, so a controller whose connection drops (it died, or was deposed) would otherwise leave
    the topic's logs and its partitions' roles partly done."""

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        await broker.start()
        try:
            link = broker.controller_link = ControllerLink(broker, MemoryStore(MemoryZooKeeper(), 1))
            link.metadata_received.set()
            client = socket.create_connection(("127.0.0.1", broker.port))
            client.sendall(leader_and_isr(broker.node_id, PARTITIONS, uuid.uuid4()))
            client.close()  # at once: the broker sees the close at the handler's first await
            # A second controller request waits for the first (one at a time, in arrival order).
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            writer.write(leader_and_isr(broker.node_id, 0, uuid.uuid4()))
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 60), "big")
            await reader.readexactly(size)
            writer.close()
            leading = [p for p in range(PARTITIONS)
                       if (partition := broker.replicas.get_partition("big", p)) is not None
                       and partition.is_leader and partition.leader_epoch == 1]
            assert len(leading) == PARTITIONS
        finally:
            await broker.stop()

    asyncio.run(scenario())


class _ChangedWhileRead(MemoryStore):
    """The topic's configs are altered (and the change announced) while the broker is reading
    them to create its logs: the AlterConfigs of an admin racing the topic's creation."""

    altered = False

    def topic_configs(self, name):
        configs = super().topic_configs(name)
        if name == "big" and not self.altered:
            self.altered = True
            self.set_topic_configs(name, {"retention.ms": "1234"})
        return configs


def test_a_config_change_announced_while_the_logs_are_created_is_applied_to_them(tmp_path):
    """A config change is applied to the logs that exist when its notification is read; a
    LeaderAndIsr creating the topic's logs at that moment read the configs before the change
    and kept them until the next change."""

    async def scenario():
        broker = Broker(tmp_path, BrokerConfig({}), port=0)
        await broker.start()
        try:
            store = _ChangedWhileRead(MemoryZooKeeper(), 1)
            topic_id = uuid.uuid4()
            store.create_topic(TopicAssignment("big", topic_id, {p: (broker.node_id,) for p in range(PARTITIONS)}), {})
            broker.dynamic_configs.store = store
            await broker.dynamic_configs.start()
            link = broker.controller_link = ControllerLink(broker, store)
            link.metadata_received.set()
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            writer.write(leader_and_isr(broker.node_id, PARTITIONS, topic_id))
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 60), "big")
            await reader.readexactly(size)
            writer.close()
            assert store.altered
            for _ in range(100):  # the notification is read by the broker's config follower task
                if broker.logs.topics["big"].config.overrides:
                    break
                await asyncio.sleep(0.05)
            assert broker.logs.topics["big"].config.overrides == {"retention.ms": 1234}
        finally:
            await broker.stop()

    asyncio.run(scenario())
