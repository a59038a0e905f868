"""CreateTopics: partitions, replication factor (1 on a single node), per-topic configs, validate_only.

In a cluster the topic is created through the store from whichever broker gets the request
(`server/cluster_admin.py`); the answer waits until this broker knows its leaders. On a
single node each topic's directories and fsyncs are made in a worker thread while the loop
serves other connections.
"""

from datetime import timedelta

from ...config import ConfigError, TopicConfig, validate_topic_configs
from ...log.manager import validate_topic_name
from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from .. import cluster_admin
from .describe_configs import SOURCE_CODES, topic_config_entries

API_KEY = 19
VERSIONS = (0, 7)  # v0-v1 removed in Kafka 4.0 (KIP-896); v1 adds validate_only

# Kafka's limit on the partitions one CreateTopics or CreatePartitions request may create
# (KAFKA-17870, KAFKA-19673/19674, also in ZooKeeper mode): beyond it every topic of the
# request is answered POLICY_VIOLATION, instead of the broker creating 2^31 logs for one frame.
MAX_NEW_PARTITIONS_PER_REQUEST = 10_000
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."


def _plan(broker, topic) -> tuple[int, dict]:
    """Check one CreatableTopic; returns (partition count, configs) or raises KafkaError."""
    validate_topic_name(topic.name)
    if broker.metadata.has_topic(topic.name):
        raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{topic.name}' already exists.")
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "Both numPartitions or replicationFactor and replicasAssignments were set.")
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise KafkaError(ErrorCode.invalid_replica_assignment, "partitions must be numbered from 0 without gaps")
        for assignment in topic.assignments:
            if list(assignment.broker_ids) != [broker.node_id]:
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"replicas must be exactly [{broker.node_id}] on this single-node cluster")
        count = len(indexes)
    else:
        count = broker.config["num.partitions"] if topic.num_partitions == -1 else topic.num_partitions
        if count <= 0:
            raise KafkaError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
        factor = broker.config["default.replication.factor"] if topic.replication_factor == -1 else topic.replication_factor
        if factor <= 0:
            raise KafkaError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
        if factor > 1:
            raise KafkaError(ErrorCode.invalid_replication_factor,
                             f"Unable to replicate the partition {factor} time(s): The target replication factor "
                             f"of {factor} cannot be reached because only 1 broker(s) are registered.")
    try:
        configs = validate_topic_configs({c.name: c.value for c in topic.configs})
    except ConfigError as exc:
        raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
    return count, configs


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    result_type = nested(response_type, "CreatableTopicResult")
    config_type = nested(response_type, "CreatableTopicConfigs")
    results = []
    seen = set()
    validate_only = getattr(request, "validate_only", False)  # v0 has no validate_only
    too_many = sum(len(topic.assignments) if topic.assignments else
                   broker.config["num.partitions"] if topic.num_partitions == -1 else max(topic.num_partitions, 0)
                   for topic in request.topics) > MAX_NEW_PARTITIONS_PER_REQUEST
    for topic in request.topics:
        error, message, topic_id, count, configs_out = ErrorCode.none, None, None, -1, None
        try:
            if too_many:
                raise KafkaError(ErrorCode.policy_violation, TOO_MANY_PARTITIONS)
            if topic.name in seen:
                raise KafkaError(ErrorCode.invalid_request, f"Topic '{topic.name}' appears more than once in the request")
            seen.add(topic.name)
            factor = 1
            if broker.membership is not None:
                timeout_ms = int(request.timeout.total_seconds() * 1000)
                topic_id, count, factor, configs = await cluster_admin.create_topic(
                    broker, topic, validate_only=validate_only, timeout_ms=timeout_ms)
                topic_id = None if validate_only else topic_id
                entries = topic_config_entries(TopicConfig(broker.config, configs))
            elif not validate_only:
                count, configs = _plan(broker, topic)
                info = await broker.create_topic_in_worker(topic.name, count, configs)
                topic_id = info.topic_id
                entries = topic_config_entries(info.config)
            else:
                count, configs = _plan(broker, topic)
                entries = topic_config_entries(TopicConfig(broker.config, configs))
            configs_out = None if config_type is None else tuple(make(config_type, name=name, value=value, read_only=False,
                                     config_source=SOURCE_CODES[source], is_sensitive=False)
                                for name, value, source in entries)
        except KafkaError as exc:
            error, message, count = exc.code, exc.message, -1
        results.append(make(result_type, name=topic.name, topic_id=topic_id, error_code=error, error_message=message,
                            topic_config_error_code=0, num_partitions=count,
                            replication_factor=factor if error == ErrorCode.none else -1, configs=configs_out))
    return make(response_type, throttle_time=timedelta(0), topics=tuple(results))
