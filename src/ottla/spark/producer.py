"""The sink's own idempotent producer: Arrow columns in, Produce v9 requests of v2 batches out (issue 16).

confluent-kafka takes a Python call per record to produce and serves a delivery report per record in
Python; this producer encodes each Arrow batch's rows per partition with `record_batches` and sends one
Produce request per partition leader. It speaks what an idempotent Kafka producer does: InitProducerId for a
producer id and epoch, and per partition sequence numbers the leader checks, so a resent batch is written
once. Up to five requests per leader are in flight while the next Arrow batches are encoded (Kafka's limit for
an idempotent producer: a broker remembers a producer's last five batches per partition, so a resent one is
recognised); a broker answers a connection's requests in order. A failed request is resent, with every later
one of its partitions, in order, until `timeout_s`. Plaintext connections only: the sink
uses confluent-kafka for any other `kafka.*` setting it does not know (`supports`).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict, deque
from datetime import timedelta

import numpy as np
import pyarrow as pa
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from ..admin_client import AdminProtocolClient, BrokerError, ProtocolClientError, error_name
from .record_batches import Batch, Columns, encode_partitioned

__all__ = ["OwnProducer", "ProduceFailed", "supports"]

PRODUCE, INIT_PRODUCER_ID = 0, 22
_PRODUCE_VERSION, _INIT_VERSION = 9, 4
_MAX_BATCH_BYTES = 1_000_000  # librdkafka's batch.size; the broker's message.max.bytes is 1 MiB by default
_BACKOFF_S = 0.05
_MAX_IN_FLIGHT = 5  # Produce requests per leader: Kafka's max.in.flight.requests.per.connection for idempotence
# Errors after which a resend can succeed (Kafka's RetriableException subclasses that Produce answers).
_RETRIABLE = {ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available, ErrorCode.request_timed_out,
              ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append,
              ErrorCode.unknown_topic_or_partition, ErrorCode.coordinator_load_in_progress,
              ErrorCode.kafka_storage_error, ErrorCode.out_of_order_sequence_number}

# Client settings this producer honours or that only tune librdkafka's batching and connections, which it
# does not have; with any other `kafka.*` setting the sink keeps to confluent-kafka.
_KNOWN = {"bootstrap.servers", "client.id", "linger.ms", "linger", "queue.buffering.max.ms", "batch.size",
          "batch.num.messages", "reconnect.backoff.ms", "reconnect.backoff.max.ms", "enable.idempotence",
          "acks", "request.required.acks", "metadata.recovery.strategy", "socket.keepalive.enable"}


def supports(client: dict[str, str]) -> bool:
    """Whether this producer can stand in for librdkafka's with these client settings."""
    return (set(client) <= _KNOWN | {"security.protocol", "partitioner"}
            and client.get("security.protocol", "plaintext").lower() == "plaintext"
            and client.get("partitioner", "murmur2_random") == "murmur2_random"
            and client.get("enable.idempotence", "true").lower() == "true"
            and client.get("acks", client.get("request.required.acks", "all")) in ("all", "-1"))


class ProduceFailed(RuntimeError):
    """Records that were not written; the producer is not to be used again."""


class OwnProducer:
    """An idempotent producer for one Spark task at a time (`send`, then `flush`), kept by the worker."""

    transactional_id: str | None = None  # set by the transactional producer (transactional.py)

    def __init__(self, client: dict[str, str], timeout_s: float):
        self._timeout_s = timeout_s
        self._cluster = AdminProtocolClient(client["bootstrap.servers"], timeout=timeout_s,
                                            client_id=client.get("client.id", "ottla-spark"))
        self._leaders: dict[str, list[int]] = {}
        self._sequences: dict[tuple[str, int], int] = defaultdict(int)
        # leader -> its requests in flight, oldest first: (connection, correlation id, [(topic, partition, batch)])
        self._in_flight: dict[int, deque] = defaultdict(deque)
        self._unsent: list[tuple[str, int, Batch]] = []  # to resend, in sequence order per partition
        self.producer_id, self.producer_epoch = self._init_producer_id()

    def _init_producer_id(self) -> tuple[int, int]:
        """A producer id and epoch for idempotence, from any broker (the transactional producer's come from its
        coordinator)."""
        response = self._retrying(lambda: self._cluster.any_connection().send(
            INIT_PRODUCER_ID, _INIT_VERSION, InitProducerIdRequest(
                transactional_id=None, transaction_timeout=timedelta(minutes=1), producer_id=-1,
                producer_epoch=-1)), "InitProducerId")
        return response.producer_id, response.producer_epoch

    def close(self) -> None:
        self._cluster.close()

    def partitions(self, topic: str) -> int:
        if topic not in self._leaders:
            self._refresh([topic])
        return len(self._leaders[topic])

    def _refresh(self, topics) -> None:
        metadata = self._cluster.metadata(sorted(topics))
        self._leaders.update({name: [p.leader for p in infos] for name, infos in metadata.items()})

    def send(self, topic: str, columns: Columns, partitions: np.ndarray | None = None) -> np.ndarray:
        """Write the rows of `columns` to `topic`, each to its partition in `partitions` (-1 or None: by key
        with murmur2 as Java clients do, a null key to one partition chosen at random per call); returns
        the partition of each row. `flush` says whether they were written."""
        count = self.partitions(topic)
        if partitions is None:
            partitions = np.full(len(columns), -1, np.int64)
        if partitions.max(initial=0) >= count:
            raise ProduceFailed(f"topic {topic!r} has {count} partitions; a row names partition {partitions.max()}")
        sequences = {p: self._sequences[topic, p] for p in range(count)}
        partitions, encoded = encode_partitioned(
            columns, partitions, count, random.randrange(count), sequences, max_bytes=_MAX_BATCH_BYTES,
            timestamp=int(time.time() * 1000), producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            transactional=self.transactional_id is not None)
        batches = []
        for partition, partition_batches in encoded:
            for batch in partition_batches:
                self._sequences[topic, partition] += batch.records
                batches.append((topic, partition, batch))
        self._submit(batches)
        return partitions

    def flush(self) -> None:
        """Wait until every record sent is written; raise ProduceFailed if some cannot be."""
        self._settle(list(self._in_flight))

    def _submit(self, batches: list) -> None:
        """One request per leader and round: a Produce request holds one batch per partition (a broker keeps
        one entry per partition, as Kafka's does: a second batch of a partition in the same request replaces
        the first), so a partition's k-th batch of this call goes in the leader's k-th request."""
        rounds = defaultdict(list)
        held: dict[tuple[str, int], int] = defaultdict(int)
        for topic, partition, batch in batches:
            rounds[self._leaders[topic][partition], held[topic, partition]].append((topic, partition, batch))
            held[topic, partition] += 1
        for (leader, _), items in sorted(rounds.items(), key=lambda entry: entry[0][1]):
            self._settle([leader], keep=_MAX_IN_FLIGHT - 1)
            if self._unsent:  # an earlier request failed: these go after its batches
                self._unsent.extend(items)
                continue
            try:
                connection = self._cluster.node_connection(leader)
                self._in_flight[leader].append((connection, connection.submit(PRODUCE, _PRODUCE_VERSION,
                                                                              self._request(items)), items))
            except ProtocolClientError:
                self._unsent.extend(items)
        if self._unsent:
            self._resend()

    def _request(self, items: list) -> ProduceRequest:
        topics = defaultdict(list)
        for topic, partition, batch in items:
            topics[topic].append(PartitionProduceData(index=partition, records=batch.data))
        return ProduceRequest(transactional_id=self.transactional_id, acks=-1,
                              timeout=timedelta(seconds=self._timeout_s),
                              topic_data=tuple(TopicProduceData(name=t, partition_data=tuple(p))
                                               for t, p in topics.items()))

    def _settle(self, leaders: list[int], keep: int = 0) -> None:
        """Take the answers of the requests in flight to `leaders`, oldest first, until `keep` are left to each;
        resend what failed and can be resent."""
        for leader in leaders:
            queue = self._in_flight.get(leader, ())
            while len(queue) > keep:
                self._take(*queue.popleft())
        if self._unsent:
            self._resend()

    def _take(self, connection, correlation_id: int, items: list) -> None:
        """The answer to one request: what it did not write is to be resent. A connection that failed is closed,
        so that the answers of the later requests on it fail at once instead of waiting out the timeout each."""
        try:
            response = connection.receive(PRODUCE, _PRODUCE_VERSION, correlation_id)
        except ProtocolClientError:
            connection.close()
            self._unsent.extend(items)
            return
        self._unsent.extend(self._failed(items, response))

    def _failed(self, items: list, response) -> list:
        """The items the response did not write; raise on an error a resend cannot fix."""
        errors = {(t.name, p.index): p for t in response.responses for p in t.partition_responses}
        failed = []
        for topic, partition, batch in items:
            answer = errors[topic, partition]
            code = ErrorCode(answer.error_code)
            if code in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
                continue  # a duplicate: an earlier attempt of this batch was written
            if code not in _RETRIABLE:
                raise ProduceFailed(f"{topic}-{partition}: {error_name(code)} ({answer.error_message})")
            failed.append((topic, partition, batch))
        return failed

    def _resend(self) -> None:
        """Resend the failed batches one request at a time, oldest first, until written or `timeout_s`."""
        for queue in self._in_flight.values():  # the batches in flight may follow failed ones of their partitions
            while queue:
                self._take(*queue.popleft())
        pending = sorted(self._unsent, key=lambda item: (item[0], item[1], item[2].data[53:57]))
        self._unsent.clear()
        deadline = time.monotonic() + self._timeout_s
        for item in pending:
            while True:
                try:
                    self._refresh({item[0]})
                    connection = self._cluster.node_connection(self._leaders[item[0]][item[1]])
                    if not self._failed([item], connection.send(PRODUCE, _PRODUCE_VERSION, self._request([item]))):
                        break
                except (ProtocolClientError, BrokerError) as exc:
                    failure = exc
                else:
                    failure = None
                if time.monotonic() > deadline:
                    raise ProduceFailed(f"{item[0]}-{item[1]} not written in {self._timeout_s} s: {failure}")
                self._cluster.close()  # connections to a restarted or moved broker are reopened
                time.sleep(_BACKOFF_S)

    def _retrying(self, call, what: str):
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                response = call()
                if response.error_code == ErrorCode.none:
                    return response
                if ErrorCode(response.error_code) not in _RETRIABLE:
                    raise ProduceFailed(f"{what}: {error_name(response.error_code)}")
                failure = error_name(response.error_code)
            except ProtocolClientError as exc:
                failure = exc
                self._cluster.close()
            if time.monotonic() > deadline:
                raise ProduceFailed(f"{what} failed for {self._timeout_s} s: {failure}")
            time.sleep(_BACKOFF_S)
