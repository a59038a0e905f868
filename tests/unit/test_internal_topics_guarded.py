"""F2 (issue 11): the internal topics cannot be deleted or re-partitioned by a client, and a
coordinator whose store fails still answers its client with a Kafka error.

A real broker in process (no sockets): handlers called directly, real files."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from kio.index import load_request_schema
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from ottla.config import BrokerConfig
from ottla.coordinator.group.records import OFFSETS_TOPIC
from ottla.coordinator.transaction import TRANSACTION_STATE_TOPIC
from ottla.errors import ErrorCode
from ottla.protocol.build import make, nested
from ottla.protocol.codec import encode_response
from ottla.server.broker import Broker
from ottla.server.context import RequestContext
from ottla.server.handlers import create_partitions, delete_topics, init_producer_id, offset_commit
from tests.waiting import coordinators_loaded

E = ErrorCode
# What Kafka answers when a coordinator cannot serve: the client looks for it again and retries.
RETRIABLE_COORDINATOR_ERRORS = (E.coordinator_not_available, E.not_coordinator)


async def started(tmp_path) -> Broker:
    broker = Broker(tmp_path, BrokerConfig({"offsets.topic.num.partitions": 2,
                                            "transaction.state.log.num.partitions": 2}))
    await broker.groups.start()
    await broker.transactions.start()
    await coordinators_loaded(broker)
    return broker


async def call(broker, module, version, request):
    ctx = RequestContext(broker, module.API_KEY, version, None, "test")
    response = await asyncio.wait_for(module.handle(ctx, request), 10)
    encode_response(module.API_KEY, version, 1, response)
    return response


def request(module, version, **fields):
    return make(load_request_schema(module.API_KEY, version), **fields)


def test_internal_topics_cannot_be_deleted(tmp_path):
    async def scenario():
        broker = await started(tmp_path)
        for version in (1, 6):
            if version >= 6:
                topic_type = nested(load_request_schema(delete_topics.API_KEY, 6), "DeleteTopicState")
                req = request(delete_topics, 6, timeout=timedelta(seconds=5), topic_names=(), topics=tuple(
                    make(topic_type, name=name, topic_id=None) for name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)))
            else:
                req = request(delete_topics, version, timeout=timedelta(seconds=5),
                              topic_names=(OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC), topics=())
            response = await call(broker, delete_topics, version, req)
            assert [(r.name, r.error_code) for r in response.responses] == [
                (OFFSETS_TOPIC, E.invalid_topic_exception), (TRANSACTION_STATE_TOPIC, E.invalid_topic_exception)]
        assert {OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC} <= set(broker.logs.topics)
        assert (tmp_path / f"{OFFSETS_TOPIC}-0").is_dir()
        init = await call(broker, init_producer_id, 4, InitProducerIdRequest(
            transactional_id="tx", transaction_timeout=timedelta(seconds=60)))
        assert init.error_code is E.none
        await broker.stop()
    asyncio.run(scenario())


def test_internal_topics_keep_their_partition_count(tmp_path):
    async def scenario():
        broker = await started(tmp_path)
        topic_type = nested(load_request_schema(create_partitions.API_KEY, 3), "CreatePartitionsTopic")
        response = await call(broker, create_partitions, 3, request(
            create_partitions, 3, timeout=timedelta(seconds=5), validate_only=False,
            topics=tuple(make(topic_type, name=name, count=5, assignments=None)
                         for name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC))))
        assert [r.error_code for r in response.results] == [E.invalid_topic_exception] * 2
        assert broker.logs.topics[OFFSETS_TOPIC].partitions == 2
        assert broker.logs.topics[TRANSACTION_STATE_TOPIC].partitions == 2
        await broker.stop()
    asyncio.run(scenario())


def test_coordinators_answer_when_their_store_fails(tmp_path):
    """The store underneath the coordinators is gone (what a client could do before F2 was
    fixed, and what a failed disk looks like): InitProducerId and OffsetCommit still get a
    Kafka error, not a raised handler and a closed connection."""
    async def scenario():
        broker = await started(tmp_path)
        broker.create_topic("t", 1, {})
        broker.delete_topic(TRANSACTION_STATE_TOPIC)
        broker.delete_topic(OFFSETS_TOPIC)
        init = await call(broker, init_producer_id, 4, InitProducerIdRequest(
            transactional_id="tx", transaction_timeout=timedelta(seconds=60)))
        assert init.error_code in RETRIABLE_COORDINATOR_ERRORS
        schema = load_request_schema(offset_commit.API_KEY, 8)
        topic_type, partition_type = nested(schema, "OffsetCommitRequestTopic"), nested(schema, "OffsetCommitRequestPartition")
        commit = await call(broker, offset_commit, 8, request(
            offset_commit, 8, group_id="g", generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, retention_time=timedelta(milliseconds=-1), topics=(make(
                topic_type, name="t", partitions=(make(partition_type, partition_index=0, committed_offset=5,
                                                       committed_leader_epoch=-1, commit_timestamp=-1,
                                                       committed_metadata=""),)),)))
        assert commit.topics[0].partitions[0].error_code in RETRIABLE_COORDINATOR_ERRORS
        await broker.stop()
    asyncio.run(scenario())
