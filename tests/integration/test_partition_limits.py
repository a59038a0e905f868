"""One CreateTopics or CreatePartitions request may create at most 10,000 partitions, as in
Kafka (KAFKA-17870, KAFKA-19673/19674): beyond, every topic of the request is answered
POLICY_VIOLATION. Without the limit a single fuzzed CreatePartitions asking for 2^31 - 1 partitions held
the broker's event loop in a loop over them until it was killed."""

from confluent_kafka import KafkaError as CKError
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def _error(future):
    try:
        future.result(60)
    except Exception as exc:  # confluent-kafka's KafkaException carries the KafkaError
        return exc.args[0]
    return None


def test_a_request_for_too_many_partitions_is_a_policy_violation_and_the_broker_stays_up(ottla_broker):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    huge = admin.create_topics([NewTopic("huge", 100_000, 1)], request_timeout=30)["huge"]
    error = _error(huge)
    assert error is not None and error.code() == CKError.POLICY_VIOLATION, error
    split = admin.create_topics([NewTopic("half-a", 5_000, 1), NewTopic("half-b", 5_001, 1)], request_timeout=30)
    assert [getattr(_error(f), "code", lambda: None)() for f in split.values()] == [CKError.POLICY_VIOLATION] * 2

    assert _error(admin.create_topics([NewTopic("small", 1, 1)])["small"]) is None
    grown = admin.create_partitions([NewPartitions("small", 100_000)], request_timeout=30)["small"]
    error = _error(grown)
    assert error is not None and error.code() == CKError.POLICY_VIOLATION, error
    assert _error(admin.create_partitions([NewPartitions("small", 3)])["small"]) is None
    assert len(admin.list_topics(timeout=30).topics["small"].partitions) == 3
