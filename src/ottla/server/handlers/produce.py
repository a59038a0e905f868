"""Produce: validate and append opaque batches; acks 0, 1 and -1 (all)."""

import datetime
from datetime import timedelta

from ...errors import ErrorCode, InvalidRecords, KafkaError
from ...protocol.build import make, nested
from ...records.batch import HEADER_SIZE, read_header
from ...records.legacy import up_convert
from ..clock import now_ms
from ..context import CloseConnection
from ..replies import fencing_as_version_says
from .metadata import INTERNAL_TOPICS

API_KEY = 0
# v0-v2 carry message format v0/v1, up-converted to a v2 batch (removed in Kafka 4.0, KIP-896).
VERSIONS = (0, 11)

_UTC = datetime.timezone.utc


def _append_time(ms: int):
    return None if ms < 0 else datetime.datetime.fromtimestamp(ms / 1000, _UTC)


def _unverified_transactional_write(broker, transactional_id, topic: str, index: int, records):
    """KIP-890 part 1: a transactional batch may only land in a partition its ongoing
    transaction has added; otherwise a late or stray write would open a transaction no
    coordinator closes and freeze the partition's last stable offset."""
    if len(records) < HEADER_SIZE:
        return None  # the log rejects the truncated batch with CORRUPT_MESSAGE
    header = read_header(records)
    if not header.is_transactional:
        return None
    if transactional_id is None:
        return ErrorCode.invalid_request, "transactional batch without a transactional id"
    verdict = broker.transactions.coordinator.verify_partitions(
        transactional_id, header.producer_id, header.producer_epoch, [(topic, index)])[(topic, index)]
    if verdict is ErrorCode.none:
        return None
    return (fencing_as_version_says(verdict),
            f"partition {topic}-{index} is not part of the ongoing transaction of {transactional_id}")


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    topic_type = nested(response_type, "TopicProduceResponse")
    partition_type = nested(response_type, "PartitionProduceResponse")
    record_error_type = nested(response_type, "BatchIndexAndErrorMessage")  # v8+ (KIP-467)
    acks = request.acks
    transactional_id = getattr(request, "transactional_id", None)
    timestamp = now_ms()
    topics = []
    for topic in request.topic_data:
        name = topic.name
        internal = name in INTERNAL_TOPICS
        partitions = []
        for data in topic.partition_data:
            error, message, record_errors = ErrorCode.none, None, ()
            base_offset, append_time, start_offset = -1, -1, -1
            log = broker.find_log(name, data.index)
            records, conversion_error = data.records, None
            if ctx.api_version < 3 and records:
                try:
                    records = up_convert(records, timestamp)
                except KafkaError as exc:
                    conversion_error = exc
            if acks not in (0, 1, -1):
                error = ErrorCode.invalid_required_acks
            elif internal:
                error, message = ErrorCode.invalid_topic_exception, f"cannot append to internal topic {name}"
            elif log is None:
                error = ErrorCode.unknown_topic_or_partition
            elif not records:
                error, message = ErrorCode.invalid_record, "empty record set"
            elif conversion_error is not None:
                error, message = conversion_error.code, conversion_error.message
            elif (refused := _unverified_transactional_write(broker, transactional_id, name, data.index,
                                                             records)) is not None:
                error, message = refused
            else:
                try:
                    result = broker.append(name, data.index, records, now=timestamp, origin="client")
                    base_offset, append_time, start_offset = result.base_offset, result.log_append_time, result.log_start_offset
                except InvalidRecords as exc:
                    error, message = exc.code, exc.message
                    record_errors = tuple(make(record_error_type, batch_index=index, batch_index_error_message=text)
                                          for index, text in exc.record_errors) if record_error_type else ()
                except KafkaError as exc:
                    error, message = exc.code, exc.message
            partitions.append(make(partition_type, index=data.index, error_code=error, base_offset=base_offset,
                                   log_append_time=_append_time(append_time), log_start_offset=start_offset,
                                   record_errors=record_errors, error_message=message))
        topics.append(make(topic_type, name=name, partition_responses=tuple(partitions)))
    if acks == 0:
        failed = [f"{t.name}-{p.index}: {p.error_code.name}" for t in topics for p in t.partition_responses
                  if p.error_code != ErrorCode.none]
        if failed:
            # Kafka's answer to a failed acks=0 produce: with no response to carry the error,
            # closing the connection makes the client refresh its metadata and notice.
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed)})")
        return None
    return make(response_type, responses=tuple(topics), throttle_time=timedelta(0), node_endpoints=())
