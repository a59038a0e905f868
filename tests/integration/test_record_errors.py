"""KIP-467: Produce v8+ names the records that made a batch invalid, so clients fail only those."""

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import InvalidRecordError, KafkaError


def test_kafka_python_fails_only_the_keyless_record_on_a_compacted_topic(ottla_broker):
    topic = "compacted-events"
    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=ottla_broker.bootstrap, linger_ms=500, retries=0)
    futures = {value: producer.send(topic, key=key, value=value, partition=0)
               for value, key in [(b"a", b"k1"), (b"b", None), (b"c", b"k3")]}  # one batch of three
    producer.flush(30)
    with pytest.raises(InvalidRecordError) as bad:
        futures[b"b"].get(timeout=10)
    assert "Compacted topic cannot accept message without key in topic partition compacted-events-0" in str(bad.value)
    for value in (b"a", b"c"):  # failed because of their neighbour, not for themselves
        with pytest.raises(KafkaError) as other:
            futures[value].get(timeout=10)
        assert not isinstance(other.value, InvalidRecordError)
        assert "part of a batch which had one more more invalid records" in str(other.value)
    retried = [producer.send(topic, key=key, value=value, partition=0) for value, key in [(b"a", b"k1"), (b"c", b"k3")]]
    assert [future.get(timeout=30).offset for future in retried] == [0, 1]
    producer.close()
