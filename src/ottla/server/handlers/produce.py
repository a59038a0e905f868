"""Produce: validate and append opaque batches; acks 0, 1 and -1 (all).

From v10 a partition answered NOT_LEADER_OR_FOLLOWER names its current leader and the
response lists its endpoint (KIP-951, `server/leader_hints.py`). v12 is v11's body; under
transactions version 2 (KIP-890 part 2, `transaction.version` 2) a transactional v12+ batch
adds its partition to the transaction rather than requiring it there already (below that
level it is verified as at v11). v13 names topics by id (KIP-516), resolved through the metadata cache:
UNKNOWN_TOPIC_ID for an id it does not know or that is not the local log's, as Kafka's
ReplicaManager.getPartitionOrException(TopicIdPartition)."""

import datetime
from datetime import timedelta

from ...errors import ErrorCode, KafkaError
from ...protocol.build import make, nested
from ...records.batch import HEADER_SIZE, read_header
from ...records.legacy import converts_inline, up_convert
from ...records.validator import inflate_limit
from ..clock import now_ms
from ..context import CloseConnection
from ..leader_hints import LeaderHints
from ..replica_manager import ProduceResult
from .. import features, txn_verification
from ..replies import fencing_as_version_says
from ..steps import Steps
from .metadata import INTERNAL_TOPICS

API_KEY = 0
# v0-v2 carry message format v0/v1, up-converted to a v2 batch (removed in Kafka 4.0, KIP-896).
VERSIONS = (0, 13)
FIRST_TV2_VERSION = 12
# A v0/v1 message set larger than this, or compressed, is up-converted in the replica manager's
# validation thread (`ReplicaManager.off_loop`), not on the event loop.
_UP_CONVERT_INLINE = 64 * 1024

_UTC = datetime.timezone.utc


def _append_time(ms: int):
    return None if ms < 0 else datetime.datetime.fromtimestamp(ms / 1000, _UTC)


# Coordinator answers a client may not retry correctly, answered NOT_ENOUGH_REPLICAS (retriable,
# no metadata refresh) as Kafka's ReplicaManager does; CONCURRENT_TRANSACTIONS only under
# transactions version 1, where the client cannot wait out the markers itself.
_UNVERIFIABLE = frozenset({ErrorCode.network_exception, ErrorCode.coordinator_load_in_progress,
                           ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})


class _Transactional:
    """KIP-890 for one Produce: a transactional batch may only land in a partition its ongoing
    transaction has added; otherwise a late or stray write would open a transaction no
    coordinator closes and freeze the partition's last stable offset. Part 2 (`add`): the
    coordinator adds the partition instead. A partition whose log already holds the
    transaction at the batch's epoch is not asked about (`ongoing`), as in Kafka; that it still
    does is checked again right before the append (`refusal`), since the marker may land while
    other partitions of the request are verified. A verdict of the coordinator holds only if no
    transactional batch of the producer (its marker above all) reached the partition's log
    between the question and the append, Kafka's VerificationGuard: `guards` are the
    producer's log states when the question was asked."""

    def __init__(self):
        self.refused: dict = {}     # partition -> (error, message), decided before the append
        self.ongoing: dict = {}     # partition -> (producer id, epoch), verified by its log alone
        self.guards: dict = {}      # partition -> its ProducerEntry (or None) before the coordinator was asked
        self.producer: tuple[int, int] | None = None
        self.add = False

    async def verify(self, broker, transactional_id, entries, add: bool) -> None:
        wanted, producer = [], None
        for tp, records in entries.items():
            if records is None or len(records) < HEADER_SIZE:
                continue  # refused later: an empty record set, or a truncated batch (CORRUPT_MESSAGE)
            header = read_header(records)
            if not header.is_transactional:
                continue
            producer = (header.producer_id, header.producer_epoch)
            await txn_verification.producer_state_loaded(broker, tp)
            if transactional_id is not None and txn_verification.ongoing_here(broker, tp, *producer):
                self.ongoing[tp] = producer
            else:
                wanted.append(tp)
        if not wanted:
            return
        if transactional_id is None:
            self.refused = {tp: (ErrorCode.invalid_request, "transactional batch without a transactional id")
                            for tp in wanted}
            return
        self.producer, self.add = producer, add
        self.guards = {tp: txn_verification.producer_entry(broker, tp, producer[0]) for tp in wanted}
        verdicts = await txn_verification.verify(broker, transactional_id, *producer, wanted, add=add)
        self.refused = {tp: _answer(error, add) for tp, error in verdicts.items() if error is not ErrorCode.none}

    def refusal(self, broker, tp):
        if tp in self.ongoing and not txn_verification.ongoing_here(broker, tp, *self.ongoing[tp]):
            return ErrorCode.invalid_txn_state, "Record was not part of an ongoing transaction"
        refused = self.refused.get(tp)
        if refused is None and tp in self.guards and not self._still_verified(broker, tp):
            return ErrorCode.invalid_txn_state, "Record was not part of an ongoing transaction"
        return refused

    def _still_verified(self, broker, tp) -> bool:
        producer_id, epoch = self.producer
        if txn_verification.ongoing_here(broker, tp, producer_id, epoch):
            return True
        now = txn_verification.producer_entry(broker, tp, producer_id)
        if now is None or now == self.guards[tp]:   # equal: reloaded (a leader change), not moved
            return True
        # Version 2: the previous transaction's marker, written at the bumped epoch this write
        # carries, is what an add waits out; it leaves the verdict standing, as in Kafka.
        return self.add and now.epoch == epoch and now.txn_first_offset is None


def _answer(error: ErrorCode, add: bool) -> tuple[ErrorCode, str]:
    """A coordinator's refusal as Kafka's Produce answers it (ReplicaManager.appendRecords)."""
    if error in _UNVERIFIABLE or (error is ErrorCode.concurrent_transactions and not add):
        return (ErrorCode.not_enough_replicas,
                f"Unable to verify the partition has been added to the transaction. Underlying error: {error.name.upper()}")
    if error is ErrorCode.invalid_txn_state:
        return error, "Partition was not added to the transaction"
    return fencing_as_version_says(error), None  # Kafka sends no message of its own for the others


def _precheck(broker, internal_topics, transactional: _Transactional, ids: dict):
    """Refusals that come before any append, per partition (None: go ahead). `ids`: the topic id
    each topic was named by (v13), which must be the local log's."""
    def check(topic: str, index: int, records):
        if topic in internal_topics:
            return ErrorCode.invalid_topic_exception, f"cannot append to internal topic {topic}"
        if topic in ids:
            local = broker.logs.topics.get(topic)
            if local is not None and local.topic_id != ids[topic]:
                return ErrorCode.unknown_topic_id, f"topic id {ids[topic]} of {topic} is not the local log's"
        if not records:
            return ErrorCode.invalid_record, "empty record set"
        return transactional.refusal(broker, (topic, index))
    return check


async def _read_topics(ctx, request, now: int, convert: bool, steps: Steps):
    """(name, topic id, partition indexes) per topic, in the request's order (v13 names topics
    by id, resolved through the metadata cache; name None: an id it does not know); with
    `convert`, each partition's records as v2 batches (v0-v2 requests carry the old message
    formats) and the partitions whose conversion failed, with the error to answer."""
    order, entries, refused = [], {}, {}
    for topic in request.topic_data:
        await steps.one()
        if ctx.api_version >= 13:
            info = ctx.broker.metadata.topic_by_id(topic.topic_id)
            name, topic_id = (info.name if info is not None else None), topic.topic_id
        else:
            name, topic_id = topic.name, None
        indexes = []
        for data in topic.partition_data:
            await steps.one()
            indexes.append(data.index)
            if name is None or not convert:
                continue
            records = data.records
            if ctx.api_version < 3 and records:
                log = ctx.broker.logs.logs.get((name, data.index))
                limit = inflate_limit(log.config["max.message.bytes"] if log is not None
                                      else ctx.broker.config["message.max.bytes"])
                try:
                    if converts_inline(records, _UP_CONVERT_INLINE):
                        records = up_convert(records, now, limit)
                    else:
                        records = await ctx.broker.replicas.off_loop(up_convert, records, now, limit)
                except KafkaError as exc:
                    refused[(name, data.index)] = ProduceResult(exc.code, exc.message)
                    continue
            entries[(name, data.index)] = records
        order.append((name, topic_id, indexes))
    return order, entries, refused


async def handle(ctx, request):
    broker = ctx.broker
    response_type = ctx.response_type
    topic_type = nested(response_type, "TopicProduceResponse")
    partition_type = nested(response_type, "PartitionProduceResponse")
    record_error_type = nested(response_type, "BatchIndexAndErrorMessage")  # v8+ (KIP-467)
    acks = request.acks
    steps = Steps()
    timestamp = now_ms()
    order, entries, results = await _read_topics(ctx, request, timestamp, acks in (0, 1, -1), steps)
    unknown = ProduceResult(ErrorCode.unknown_topic_id, "unknown topic id")
    if acks not in (0, 1, -1):
        results = {(name, index): ProduceResult(ErrorCode.invalid_required_acks)
                   for name, _, indexes in order for index in indexes}
    else:
        ids = {name: topic_id for name, topic_id, _ in order if name is not None and topic_id is not None}
        add = ctx.api_version >= FIRST_TV2_VERSION and features.tv2_enabled(broker.config)
        transactional = _Transactional()
        await transactional.verify(broker, getattr(request, "transactional_id", None), entries, add)
        results.update(await broker.replicas.append_records(
            entries, acks=acks, timeout_ms=int(request.timeout.total_seconds() * 1000), now_ms=timestamp,
            origin="client", precheck=_precheck(broker, INTERNAL_TOPICS, transactional, ids)))
    hints = LeaderHints(broker.metadata, response_type)
    topics = []
    for name, topic_id, indexes in order:
        await steps.one()
        partitions = []
        for index in indexes:
            await steps.one()
            result = results[(name, index)] if name is not None else unknown
            record_errors = tuple(make(record_error_type, batch_index=i, batch_index_error_message=text)
                                  for i, text in result.record_errors) if record_error_type else ()
            partitions.append(make(partition_type, index=index, error_code=result.error,
                                   base_offset=result.base_offset,
                                   log_append_time=_append_time(result.log_append_time),
                                   log_start_offset=result.log_start_offset, record_errors=record_errors,
                                   error_message=result.message,
                                   **hints.current_leader(name, index, result.error)))
        topics.append(make(topic_type, name=name, topic_id=topic_id, partition_responses=tuple(partitions)))
    if acks == 0:
        failed = [f"{name or topic_id}-{p.index}: {p.error_code.name}" for (name, topic_id, _), t in zip(order, topics)
                  for p in t.partition_responses if p.error_code != ErrorCode.none]
        if failed:
            # Kafka's answer to a failed acks=0 produce: with no response to carry the error,
            # closing the connection makes the client refresh its metadata and notice.
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed)})")
        return None
    return make(response_type, responses=tuple(topics), throttle_time=timedelta(0),
                node_endpoints=hints.node_endpoints())
