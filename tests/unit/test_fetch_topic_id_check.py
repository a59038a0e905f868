"""Fetch v13+ and Produce v13 name topics by id (KIP-516). When the metadata cache already
names a recreated topic (a new id for the same name) while this broker's log is still the old
topic's - in a ZooKeeper cluster, an UpdateMetadata that arrives before the LeaderAndIsr
replacing the log - a fetch by the new id must not be served the old topic's records (Kafka's
ReplicaManager.readFromLog answers INCONSISTENT_TOPIC_ID) nor a produce by it land in the old
log (Kafka's getPartitionOrException(TopicIdPartition): UNKNOWN_TOPIC_ID); the old id is
UNKNOWN_TOPIC_ID.

Driven in-process; on real brokers the state lasts when the LeaderAndIsr of the new id is
refused INCONSISTENT_TOPIC_ID (`test_reassign_and_topic_ids_cluster.py`)."""

import asyncio
import uuid
from datetime import timedelta
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.fetch.v13.response import FetchResponse
from kio.schema.produce.v13 import request as produce13
from kio.schema.produce.v13.response import ProduceResponse
from kio.serial import entity_reader

from ottla.config import BrokerConfig
from ottla.protocol.codec import EncodedBody
from ottla.server.broker import Broker
from ottla.server.handlers import fetch, produce
from ottla.server.metadata_cache import PartitionState


def _fetch(broker, topic_id):
    request = fetch13.FetchRequest(max_wait=timedelta(0), min_bytes=0, forgotten_topics_data=(), topics=(
        fetch13.FetchTopic(topic_id=topic_id, partitions=(
            fetch13.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),))
    ctx = SimpleNamespace(broker=broker, api_version=13, response_type=FetchResponse)
    response = asyncio.run(fetch.handle(ctx, request))
    if isinstance(response, EncodedBody):  # an answer with no records comes encoded
        response, _ = entity_reader(FetchResponse)(response, 0)
    return response.responses[0].partitions[0].error_code


def _produce(broker, topic_id):
    request = produce13.ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=5), topic_data=(
        produce13.TopicProduceData(topic_id=topic_id, partition_data=(
            produce13.PartitionProduceData(index=0, records=_BATCH),)),))
    ctx = SimpleNamespace(broker=broker, api_version=13, response_type=ProduceResponse)
    response = asyncio.run(produce.handle(ctx, request))
    return response.responses[0].partition_responses[0].error_code


def _batch() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 16)
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    return bytes(builder.build())


_BATCH = _batch()


def test_fetch_by_the_id_of_a_topic_whose_local_log_is_another_is_inconsistent(tmp_path):
    broker = Broker(tmp_path / "data", BrokerConfig({}), host="127.0.0.1", port=0)
    old_id = broker.create_topic("t", 1, {}).topic_id
    assert _fetch(broker, old_id) == ErrorCode.none
    assert _produce(broker, old_id) == ErrorCode.none
    new_id = uuid.uuid4()
    broker.metadata.update(controller_id=0, controller_epoch=1, brokers=[broker.metadata.broker(0)],
                           partition_states=[PartitionState("t", 0, 0, 1, (0,), (0,))],
                           topic_ids={"t": new_id}, full=True)
    assert _fetch(broker, new_id) == ErrorCode.inconsistent_topic_id
    assert _fetch(broker, old_id) == ErrorCode.unknown_topic_id
    assert _produce(broker, new_id) == ErrorCode.unknown_topic_id
    assert _produce(broker, old_id) == ErrorCode.unknown_topic_id
    assert broker.logs.logs[("t", 0)].log_end_offset == 1  # only the first produce landed
