"""A single node's topic creation and deletion touch that topic only (issue 11): re-publishing
every topic per creation made the 2,000th creation cost 100 ms of the event loop, and a
500-topic CreateTopics hold it for 25 s."""

import asyncio

from ottla.config import BrokerConfig
from ottla.server import partition as partition_module
from ottla.server.broker import Broker


def test_creating_and_deleting_a_topic_changes_only_that_topic(tmp_path, monkeypatch):
    async def scenario():
        broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
        for i in range(5):
            broker.create_topic(f"existing-{i}", 3, {})
        made_leader = []
        original = partition_module.Partition.make_leader

        def counting(self, *args, **kwargs):
            made_leader.append((self.topic, self.index))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(partition_module.Partition, "make_leader", counting)
        info = broker.create_topic("new", 2, {})
        assert sorted(made_leader) == [("new", 0), ("new", 1)]
        assert broker.metadata.topic_by_id(info.topic_id).name == "new"
        assert broker.metadata.check_leader("new", 1).leader == broker.node_id
        broker.add_partitions("new", 3)
        assert broker.metadata.topic("new").partition_count == 3
        broker.delete_topic("existing-0")
        assert broker.metadata.topic_names() == ["existing-1", "existing-2", "existing-3", "existing-4", "new"]
        assert ("existing-0", 0) not in broker.replicas.partitions
        assert {topic for topic, _ in made_leader} == {"new"}  # growing "new" re-led its partitions only

    asyncio.run(scenario())
