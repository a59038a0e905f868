"""Executor-side reads: Fetch requests over Ottla's own protocol client, answers decoded column-wise.

A read task asks the partition's leader for record batches from its position (Fetch, read_committed
or not), decodes them to columns (`columns.py`) and moves its position past the last whole batch,
control and aborted batches included, until the position reaches the range end. Leaders come from
Metadata; NOT_LEADER_OR_FOLLOWER and its kin, or a lost connection, make the task look the leader up
again and retry. OFFSET_OUT_OF_RANGE (the offsets were deleted) fails the task or, with
failOnDataLoss=false, moves it to the log start, as Spark's Kafka source does.

The next Fetch is sent as soon as an answer's batch headers say where it starts, before its records are
decoded: the broker reads and sends the next answer while this one is walked and handed to Spark, as a
Kafka consumer's fetcher asks ahead while the application takes the records it already has.

The client speaks PLAINTEXT only (Ottla has no SSL or SASL listener): the read options turn other
security settings down when the query starts (`options.parse_read_options`).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from functools import cache
from types import ModuleType
from typing import Iterator

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from ..admin_client import FETCH, LIST_OFFSETS, AdminProtocolClient, BrokerConnection, BrokerError, \
    ProtocolClientError
from ..protocol.build import make
from .columns import FetchedColumns, decode_record_set
from .options import DataLossError, ReadOptions

__all__ = ["read_columns"]

log = logging.getLogger(__name__)

# librdkafka's defaults for the settings of the same names, which a query may set (`kafka.` options).
_FETCH_WAIT_MAX_MS = 10  # the reader's own default: a range ends at or below the LSO, it never waits for more
# The reader's own default (Kafka's and librdkafka's: 1 MiB): a task asks for one partition per Fetch, where a
# consumer's Fetch carries up to fetch.max.bytes (50 MiB) over its partitions, so a Fetch's fixed costs (the
# broker's and the worker's) came with every MiB. At 2 MiB the broker's CPU per 100-byte record went from 0.2 to
# 0.1-0.125 us and the worker's down 0.05-0.1 us; 4 MiB cost the worker more again (larger buffers to fault in;
# docs/performance.md, Spark section, branch sourcewarm).
_MAX_PARTITION_FETCH_BYTES = 2 << 20
_SOCKET_TIMEOUT_MS = 60_000
_RETRY_BACKOFF_MS = 100
_EARLIEST = -2  # ListOffsets timestamp: the log start
_CLIENTS: dict[tuple, AdminProtocolClient] = {}  # kept by a Python worker between tasks


class _OffsetsLost(Exception):
    """A Fetch answered OFFSET_OUT_OF_RANGE."""


def read_columns(topic: str, partition: int, start: int, end: int, options: ReadOptions,
                 headers_type) -> Iterator[FetchedColumns]:
    """The records at offsets [start, end) of one topic-partition, one `FetchedColumns` per Fetch answer
    that has any. A range is done when the position reaches `end`: the offsets of transaction markers
    and aborted records hold nothing to read, and the position moves past them."""
    reader = _Reader(topic, partition, options)
    position, last_progress = start, time.monotonic()
    try:
        while position < end:
            try:
                columns = reader.fetch(position, end, headers_type)
            except _OffsetsLost:
                position = _skip_lost(reader, position, end, options)
                continue
            if columns is not None and columns.next_offset > position:
                position, last_progress = columns.next_offset, time.monotonic()
                if len(columns):
                    yield columns
                continue
            if time.monotonic() - last_progress > options.poll_timeout_s:
                message = (f"{topic}-{partition}: stuck at offset {position} for {options.poll_timeout_s:.0f}s "
                           f"while reading up to offset {end}")
                if options.fail_on_data_loss:
                    raise DataLossError(message + "; set failOnDataLoss=false to skip the rest of the range")
                log.warning("%s; skipping the rest of the range", message)
                return
            time.sleep(_RETRY_BACKOFF_MS / 1000)
    finally:
        reader.close()


def _skip_lost(reader: "_Reader", position: int, end: int, options: ReadOptions) -> int:
    """Offsets below the log start were deleted: fail, or jump to the log start when allowed."""
    low = reader.log_start()
    message = (f"{reader.topic}-{reader.partition}: offsets {position}..{min(low, end)} are no longer "
               "available (OFFSET_OUT_OF_RANGE)")
    if options.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them", message)
    return min(max(low, position), end) if low > position else end


def _client(options: ReadOptions) -> AdminProtocolClient:
    """One client per Python worker and bootstrap list, kept between tasks (Spark reuses its workers):
    a task then fetches without a new connection's ApiVersions and Metadata round trips."""
    config = options.client
    key = (config["bootstrap.servers"], config.get("client.id", "ottla-spark-reader"),
           config.get("socket.timeout.ms", _SOCKET_TIMEOUT_MS))
    if key not in _CLIENTS:
        _CLIENTS[key] = AdminProtocolClient(key[0], timeout=int(key[2]) / 1000, client_id=key[1])
    return _CLIENTS[key]


def _forget(options: ReadOptions) -> None:
    """Drop the worker's client (a connection failed or a leader moved): the next one starts afresh."""
    for key, client in list(_CLIENTS.items()):
        if key[0] == options.client["bootstrap.servers"]:
            client.close()
            del _CLIENTS[key]


@cache
def _fetch_module(version: int) -> ModuleType:
    return load_payload_module(FETCH, version, EntityType.request)


class _Reader:
    """Fetch answers for one topic-partition from its leader, the next one asked for before this one is
    decoded."""

    def __init__(self, topic: str, partition: int, options: ReadOptions):
        self.topic, self.partition, self.options = topic, partition, options
        config = options.client
        self.max_wait_ms = int(config.get("fetch.wait.max.ms", _FETCH_WAIT_MAX_MS))
        self.max_bytes = int(config.get("max.partition.fetch.bytes", _MAX_PARTITION_FETCH_BYTES))
        self.isolation_level = 1 if options.read_committed else 0
        # The Fetch sent and not yet answered: (its offset, connection, version, correlation id).
        self._asked: tuple[int, BrokerConnection, int, int] | None = None

    def fetch(self, position: int, end: int, headers_type) -> FetchedColumns | None:
        """The records of one Fetch answer from `position`; None when the answer was a retriable error
        (the client is dropped and the leader looked up again). The Fetch from the answer's next offset,
        if below `end`, is sent before the records are decoded."""
        try:
            answer = self._request(position)
        except ProtocolClientError as exc:
            log.info("%s-%d: fetch at offset %d failed (%s); retrying", self.topic, self.partition, position, exc)
            _forget(self.options)
            return None
        if answer.error_code == ErrorCode.offset_out_of_range:
            raise _OffsetsLost()
        if answer.error_code != ErrorCode.none:
            if not ErrorCode(answer.error_code).retriable:
                raise BrokerError(answer.error_code, f"Fetch {self.topic}-{self.partition}")
            _forget(self.options)
            return None
        records = answer.records or b""
        aborted = None
        if self.isolation_level:
            aborted = [(txn.producer_id, txn.first_offset) for txn in answer.aborted_transactions or ()]
        columns = decode_record_set(records, position, end, aborted, headers_type,
                                    lambda offset: offset < end and self._ask_ahead(offset))
        if columns.next_offset == position and records:
            self.max_bytes *= 2  # a batch larger than the limit, which a broker without KIP-74 cuts
        return columns

    def close(self) -> None:
        """A Fetch still unanswered (the task stopped reading, or failed) leaves its answer on the worker's
        connection: drop the client, so that the next task's first answer is its own."""
        if self._asked is not None:
            self._asked = None
            _forget(self.options)

    def _ask(self, position: int) -> None:
        connection = _client(self.options).leader_connection(self.topic, self.partition)
        version = connection.version_for(FETCH)
        module = _fetch_module(version)
        wanted = make(module.FetchPartition, partition=self.partition, fetch_offset=position,
                      partition_max_bytes=self.max_bytes, current_leader_epoch=-1, log_start_offset=-1)
        body = make(module.FetchRequest, replica_id=-1, max_wait=timedelta(milliseconds=self.max_wait_ms), min_bytes=1,
                    max_bytes=self.max_bytes, isolation_level=self.isolation_level, session_id=0,
                    session_epoch=-1, topics=(module.FetchTopic(topic=self.topic, partitions=(wanted,)),),
                    forgotten_topics_data=(), rack_id="")
        self._asked = (position, connection, version, connection.submit(FETCH, version, body))

    def _ask_ahead(self, position: int) -> None:
        """Send the next Fetch now; a failure is left to its turn (`_request` asks again and handles it)."""
        try:
            self._ask(position)
        except ProtocolClientError as exc:
            log.info("%s-%d: fetch ahead at offset %d failed (%s)", self.topic, self.partition, position, exc)
            self._asked = None
            _forget(self.options)

    def _request(self, position: int):
        if self._asked is not None and self._asked[0] != position:
            self.close()
        if self._asked is None:
            self._ask(position)
        _, connection, version, correlation_id = self._asked
        self._asked = None
        response = connection.receive(FETCH, version, correlation_id)
        if getattr(response, "error_code", ErrorCode.none) != ErrorCode.none:  # Fetch v7+
            raise BrokerError(response.error_code, f"Fetch {self.topic}-{self.partition}")
        return response.responses[0].partitions[0]

    def log_start(self) -> int:
        """The partition's log start offset (ListOffsets earliest, from the leader)."""
        self.close()
        connection = _client(self.options).leader_connection(self.topic, self.partition)

        def build(module):
            wanted = make(module.ListOffsetsPartition, partition_index=self.partition, current_leader_epoch=-1,
                          timestamp=_EARLIEST)
            return make(module.ListOffsetsRequest, replica_id=-1, isolation_level=self.isolation_level,
                        topics=(module.ListOffsetsTopic(name=self.topic, partitions=(wanted,)),))

        answer = connection.request(LIST_OFFSETS, build).topics[0].partitions[0]
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, f"ListOffsets {self.topic}-{self.partition}")
        return answer.offset

