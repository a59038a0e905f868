"""A KIP-848 consumer (group.protocol=consumer) is told the protocol is unsupported, not left waiting."""

import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic


def test_librdkafka_consumer_protocol_gets_a_clear_fatal_error(ottla_broker):
    admin = AdminClient({"bootstrap.servers": ottla_broker.bootstrap})
    admin.create_topics([NewTopic("kip848", 1, 1)])["kip848"].result(15)
    consumer = Consumer({"bootstrap.servers": ottla_broker.bootstrap, "group.id": "new-protocol",
                         "group.protocol": "consumer"})
    consumer.subscribe(["kip848"])
    error = None
    deadline = time.monotonic() + 60
    while error is None and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error():
            error = message.error()
    consumer.close()
    assert error is not None, "the consumer waited without any error"
    assert error.code() == KafkaError._FATAL
    assert "ConsumerGroupHeartbeat" in error.str() and "not supported" in error.str()
