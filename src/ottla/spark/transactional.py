"""The exactly-once sink's own transactional producer: the own producer's Produce of Arrow-encoded batches,
inside Kafka transactions (issue 16; confluent-kafka took a Python call per row).

It sends what a transactional Kafka client sends, and per micro-batch no more:

- once per producer: FindCoordinator (TRANSACTION) and InitProducerId with the transactional id, which
  bumps the id's epoch and so fences every earlier producer of the id (its open transaction is aborted);
- per transaction: AddOffsetsToTxn for the marker's group (answered PRODUCER_FENCED when another producer of
  the id initialised since) and TxnOffsetCommit to the group's coordinator; AddPartitionsToTxn before the
  first Produce to a partition; the Produce requests (transactional batches, acks=all, sequence numbers per
  partition); EndTxn.

Coordinator answers are retried as Kafka clients retry them: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and
a lost connection look the coordinator up again; COORDINATOR_LOAD_IN_PROGRESS and CONCURRENT_TRANSACTIONS
(the markers of the previous transaction are still being written) ask the same one again after a backoff;
all until `timeout_s`.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Callable

from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.txn_offset_commit.v3.request import (TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition,
                                                     TxnOffsetCommitRequestTopic)

from ..admin_client import BrokerConnection, Node, ProtocolClientError, error_name
from ..protocol.schemas import api_name
from .marker import MarkerTask
from .options import WriteOptions
from .producer import OwnProducer, ProduceFailed

__all__ = ["Fenced", "Task", "TransactionalProducer"]

log = logging.getLogger(__name__)

GROUP, TRANSACTION = 0, 1  # FindCoordinator key types
_TRANSACTION_TIMEOUT = timedelta(minutes=1)  # librdkafka's transaction.timeout.ms
_BACKOFF_S = 0.02  # Java's producer retries CONCURRENT_TRANSACTIONS after 20 ms: markers take milliseconds
_AGAIN = {ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions,
          ErrorCode.unstable_offset_commit, ErrorCode.unknown_topic_or_partition}
_ELSEWHERE = {ErrorCode.not_coordinator, ErrorCode.coordinator_not_available}
_FENCED = {ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch}


class Fenced(ProduceFailed):
    """Another producer with this transactional id initialised since: this one can do nothing more."""


class _Retry(Exception):
    """A coordinator answer to ask again (`elsewhere`: of the coordinator looked up again)."""

    def __init__(self, reason, elsewhere: bool):
        super().__init__(reason)
        self.elsewhere = elsewhere


def _first_error(codes) -> int:
    """The error of a per-partition answer: the first that is not OPERATION_NOT_ATTEMPTED (Kafka's answer for
    the partitions it left alone because of another's error), else that, else none."""
    codes = [code for code in codes if code != ErrorCode.none]
    return next((c for c in codes if c != ErrorCode.operation_not_attempted), codes[0] if codes else 0)


class TransactionalProducer(OwnProducer):
    """One transactional id's producer: `begin`, `send_offsets`, `send`..., then `commit` or `abort`."""

    def __init__(self, client: dict[str, str], transactional_id: str, timeout_s: float):
        self.transactional_id = transactional_id
        self._coordinators: dict[tuple[int, str], Node] = {}  # (key type, key) -> the coordinator
        self._added: set[tuple[str, int]] = set()  # partitions in the open transaction
        self._open = False  # whether the coordinator has something of this transaction to end
        super().__init__(client, timeout_s)  # InitProducerId, by way of _init_producer_id

    def _init_producer_id(self) -> tuple[int, int]:
        request = InitProducerIdRequest(transactional_id=self.transactional_id,
                                        transaction_timeout=_TRANSACTION_TIMEOUT, producer_id=-1, producer_epoch=-1)
        response = self._ask(TRANSACTION, self.transactional_id, request, lambda r: r.error_code)
        return response.producer_id, response.producer_epoch

    def committed(self, group: str, topic: str, partition: int) -> int:
        """The group's committed offset of the partition (-1: none), once no transaction holds one pending
        (OffsetFetch with require_stable)."""
        request = OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=(
            OffsetFetchRequestTopics(name=topic, partition_indexes=(partition,)),)),), require_stable=True)

        def error(response):
            answer = response.groups[0]
            return answer.error_code or next((p.error_code for t in answer.topics for p in t.partitions), 0)

        response = self._ask(GROUP, group, request, error)
        return next((p.committed_offset for t in response.groups[0].topics for p in t.partitions), -1)

    def begin(self) -> None:
        self._added.clear()
        self._open = False

    def send_offsets(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Commit `offset` for `group` with the transaction (AddOffsetsToTxn, then TxnOffsetCommit). Raises
        Fenced, before anything is written, if another producer of this id initialised since."""
        add_offsets = AddOffsetsToTxnRequest(transactional_id=self.transactional_id, producer_id=self.producer_id,
                                             producer_epoch=self.producer_epoch, group_id=group)
        self._ask(TRANSACTION, self.transactional_id, add_offsets, lambda r: r.error_code)
        self._open = True
        commit = TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch, generation_id=-1, member_id="", group_instance_id=None,
            topics=(TxnOffsetCommitRequestTopic(name=topic, partitions=(TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=""),)),))
        self._ask(GROUP, group, commit,
                  lambda r: _first_error(p.error_code for t in r.topics for p in t.partitions))

    def _submit(self, batches: list) -> None:
        """Add the partitions new to the transaction (AddPartitionsToTxn) before their first Produce."""
        new = sorted({(topic, partition) for topic, partition, _ in batches} - self._added)
        if new:
            topics: dict[str, list[int]] = {}
            for topic, partition in new:
                topics.setdefault(topic, []).append(partition)
            request = AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
                v3_and_below_producer_epoch=self.producer_epoch, v3_and_below_topics=tuple(
                    AddPartitionsToTxnTopic(name=t, partitions=tuple(p)) for t, p in topics.items()))
            self._ask(TRANSACTION, self.transactional_id, request,
                      lambda r: _first_error(p.partition_error_code for t in r.results_by_topic_v3_and_below
                                             for p in t.results_by_partition))
            self._open = True
            self._added.update(new)
        super()._submit(batches)

    def commit(self) -> None:
        """Wait for every record sent, then commit (EndTxn): the records and offsets become visible."""
        self.flush()
        self._end(True)

    def abort(self) -> None:
        """Abort what the coordinator has of the transaction; the records sent are never read committed. The
        Produce requests in flight are answered first, so that none lands after the abort's markers."""
        try:
            self.flush()
        except (ProduceFailed, ProtocolClientError):
            pass  # what failed is aborted with the rest
        self._end(False)

    def _end(self, committed: bool) -> None:
        if self._open:
            end = EndTxnRequest(transactional_id=self.transactional_id, producer_id=self.producer_id,
                                producer_epoch=self.producer_epoch, committed=committed)
            self._ask(TRANSACTION, self.transactional_id, end, lambda r: r.error_code)
        self.begin()

    def _ask(self, key_type: int, key: str, request, error: Callable[[object], int]):
        """Send `request` (a kio request class, which names its API and version) to the coordinator of `key`
        and return the answer, retrying until `timeout_s`. The Produce requests in flight are answered first:
        the coordinator may lead partitions too, and a connection's answers are read in the order its requests
        went."""
        self._settle(list(self._in_flight))
        api_key, version, what = request.__api_key__, request.__version__, api_name(request.__api_key__)
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                response = self._coordinator(key_type, key).send(api_key, version, request)
                code = ErrorCode(error(response))
                if code == ErrorCode.none:
                    return response
                if code in _FENCED:
                    raise Fenced(f"{what} for {self.transactional_id!r}: {error_name(code)}")
                if code not in _AGAIN | _ELSEWHERE:
                    raise ProduceFailed(f"{what} for {key!r}: {error_name(code)}")
                raise _Retry(error_name(code), code in _ELSEWHERE)
            except (ProtocolClientError, _Retry) as exc:
                failure = exc
                log.info("%s for %r: %s; %s", what, key, exc, "looking up the coordinator again"
                         if not isinstance(exc, _Retry) or exc.elsewhere else "asking again")
                if not isinstance(exc, _Retry) or exc.elsewhere:
                    self._coordinators.pop((key_type, key), None)
                if not isinstance(exc, _Retry):
                    self._reconnect()
            if time.monotonic() > deadline:
                raise ProduceFailed(f"{what} for {key!r} failed for {self._timeout_s} s: {failure}")
            time.sleep(_BACKOFF_S)

    def _coordinator(self, key_type: int, key: str) -> BrokerConnection:
        """The connection to the coordinator of `key`, looked up with FindCoordinator once and after it moved. The
        answer's host and port are the coordinator's address, as Kafka clients take them: no Metadata request."""
        node = self._coordinators.get((key_type, key))
        if node is None:
            find = FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,))
            response = self._cluster.any_connection().send(find.__api_key__, find.__version__, find)
            answer = response.coordinators[0]
            if answer.error_code != ErrorCode.none:
                code = ErrorCode(answer.error_code)
                if code not in _AGAIN | _ELSEWHERE:
                    raise ProduceFailed(f"FindCoordinator for {key!r}: {error_name(code)}")
                raise _Retry(f"FindCoordinator: {error_name(code)}", True)
            node = self._coordinators[key_type, key] = Node(answer.node_id, answer.host, answer.port)
        return self._cluster.connection_to(node)

    def _reconnect(self) -> None:
        """After a lost connection: take the answers of the Produce requests in flight, then drop every
        connection (one to a restarted or moved broker is reopened)."""
        try:
            self.flush()
        finally:
            self._cluster.close()


class Task(MarkerTask):
    """The exactly-once write task's own transactional producer: AddOffsetsToTxn tells a kept one that it was
    fenced (marker.py has the protocol)."""

    fenced = Fenced

    def __init__(self, ident: str, options: WriteOptions):
        super().__init__(ident, options)
        self.producer = TransactionalProducer(options.client, ident, options.timeout_s)

    def _read_marker(self) -> int:
        return self.producer.committed(self.ident, self.options.marker_topic, 0)

    def _open(self, offset: int) -> None:
        self.producer.begin()
        self.producer.send_offsets(self.ident, self.options.marker_topic, 0, offset)

    def _fence_again(self) -> None:
        self.producer.close()
        self.producer = TransactionalProducer(self.options.client, self.ident, self.options.timeout_s)

    def _commit(self) -> None:
        self.producer.commit()

    def close(self) -> None:
        self.producer.close()

    def discard(self) -> None:
        """After a failure: abort so the partitions' LSO is not held back, and never reuse this producer. If the
        abort fails too (fenced, broker gone), the next attempt's InitProducerId aborts the transaction."""
        try:
            self.producer.abort()
        except (ProduceFailed, ProtocolClientError):
            pass
        finally:
            self.producer.close()
