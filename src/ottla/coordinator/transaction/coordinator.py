"""The transaction coordinator (KIP-98) as a plain state machine driven by method calls.

No sockets, no asyncio, no clock: every request method takes `now_ms` and answers through a
`respond` callback exactly once, either at once (validation errors, idempotent retries) or
when the state change it made is durable in `__transaction_state`. Durability and the commit
and abort markers go through two injected interfaces, `TxnLogStore` and `MarkerWriter`, so
the same class runs under the broker and in unit tests with in-memory fakes.

Protocol levels: transactions version 1 is KIP-98 with KIP-360 (epoch bumps on InitProducerId
with a known producer id and epoch) and KIP-588 (PRODUCER_FENCED; the request handlers turn
it into INVALID_PRODUCER_EPOCH for the versions that predate it); `verify_partitions` is the
server-side check of KIP-890 part 1 for its produce path. Transactions version 2 (KIP-890
part 2, `end_txn_v2`; the broker offers it when `transaction.version` is 2) adds partitions
as the transaction's writes arrive (`add_partitions` with `transaction_version=2`, asked by
the partition leader) and bumps the epoch at every EndTxn, so that the markers fence any
late write of the transaction that just ended. Each transaction runs under the version its
client chose; both live side by side.

Flow of a transaction (numbers from the KIP-98 data flow):
  2   init_producer_id  -> Empty, new epoch (durable before the answer)
  4.1 add_partitions / 4.3 add_offsets -> Ongoing (durable before the answer; one that arrives
      while the previous transaction completes, 5.2-5.3, waits for that)
  5.1 end_txn           -> PrepareCommit/PrepareAbort durable, then the client is answered
  5.2 markers written by the MarkerWriter to every partition of the transaction
  5.3 CompleteCommit/CompleteAbort appended
A coordinator that loads a partition finds every transaction whose Prepare record has no
Complete record after it and redoes 5.2 and 5.3 (roll forward).
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Iterable, Mapping

from ...config import BrokerConfig
from ...errors import ErrorCode
from ..partitioning import partition_for
from .contracts import (
    InitProducerIdResult,
    ListTransactionsResult,
    MarkerWriter,
    TxnDescription,
    TxnListing,
    TxnLogStore,
)
from .log_format import (
    TRANSACTION_STATE_TOPIC,
    TopicPartition,
    TxnState,
    encode_key,
    encode_value,
)
from .metadata import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    EndTxnResult,
    TxnMetadata,
    TxnSnapshot,
    is_epoch_exhausted,
)

log = logging.getLogger("ottla.txn")

GROUP_METADATA_TOPIC = "__consumer_offsets"

_ErrorCallback = Callable[[ErrorCode], None]


class _Partition:
    """One `__transaction_state` partition this coordinator leads."""

    __slots__ = ("index", "coordinator_epoch", "loading", "txns", "completing")

    def __init__(self, index: int, coordinator_epoch: int):
        self.index = index
        self.coordinator_epoch = coordinator_epoch
        self.loading = True
        self.txns: dict[str, TxnMetadata] = {}
        # Ids whose markers or Complete record are being written -> the requests held until then
        # (each: how to run it again, how to refuse it).
        self.completing: dict[str, list[tuple[Callable[[], None], _ErrorCallback]]] = {}


# How Kafka reports a failed transaction-log append to the client (retriable where possible).
_APPEND_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
}


class TransactionCoordinator:
    """Coordinator for the `__transaction_state` partitions loaded into it.

    Not thread-safe: the broker drives it from its event loop, and the store and marker
    writer must call back on that loop too (synchronously is fine).
    """

    def __init__(self, config: BrokerConfig, store: TxnLogStore, markers: MarkerWriter,
                 next_producer_id: Callable[[], int]):
        self._store = store
        self._markers = markers
        self._next_producer_id = next_producer_id
        self.num_partitions: int = config["transaction.state.log.num.partitions"]
        self._offsets_partitions: int = config["offsets.topic.num.partitions"]
        self._max_timeout_ms: int = config["transaction.max.timeout.ms"]
        self._expiration_ms: int = config["transactional.id.expiration.ms"]
        self._abort_interval_ms: int = config["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
        self._expire_interval_ms: int = config["transaction.remove.expired.transaction.cleanup.interval.ms"]
        self._next_expiration_ms: int | None = None
        self._partitions: dict[int, _Partition] = {}
        self._unfinished: list[tuple[_Partition, TxnMetadata]] = []

    # Partition ownership ------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def load_partition(self, partition: int, coordinator_epoch: int, now_ms: int) -> None:
        """Become coordinator for `partition` (its leader epoch is the coordinator epoch).

        Requests for its ids get COORDINATOR_LOAD_IN_PROGRESS until the store hands over the
        records; then interrupted completions are rolled forward.
        """
        part = _Partition(partition, coordinator_epoch)
        self._partitions[partition] = part
        self._store.load(partition, lambda records: self._on_loaded(part, records, now_ms))

    def unload_partition(self, partition: int) -> None:
        """Stop coordinating `partition`; answers still in flight for it become NOT_COORDINATOR."""
        part = self._partitions.pop(partition, None)
        if part is not None:
            self._refuse_held(part, ErrorCode.not_coordinator)

    def _on_loaded(self, part: _Partition, txns: Mapping[str, TxnMetadata], now_ms: int) -> None:
        if self._partitions.get(part.index) is not part:
            return
        part.txns.update(txns)
        part.loading = False
        log.debug("loaded %d transactional ids from %s-%d (coordinator epoch %d)",
                 len(part.txns), TRANSACTION_STATE_TOPIC, part.index, part.coordinator_epoch)
        for meta in list(part.txns.values()):
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("rolling forward %s of %s", meta.state.display_name, meta.transactional_id)
                self._write_markers(part, meta, now_ms)

    def _lookup(self, transactional_id: str) -> tuple[_Partition | None, ErrorCode]:
        part = self._partitions.get(self.partition_for(transactional_id))
        if part is None:
            return None, ErrorCode.not_coordinator
        if part.loading:
            return None, ErrorCode.coordinator_load_in_progress
        return part, ErrorCode.none

    # InitProducerId -----------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int,
                         expected: tuple[int, int] | None, now_ms: int,
                         respond: Callable[[InitProducerIdResult], None]) -> None:
        """Hand out the producer id and a new epoch for `transactional_id`.

        `expected` is the (producer id, epoch) a KIP-360 client already holds, or None.
        (Idempotent producers, without a transactional id, never reach the coordinator.)
        """
        if not transactional_id:
            respond(InitProducerIdResult(ErrorCode.invalid_request))
            return
        if not 0 < timeout_ms <= self._max_timeout_ms:
            respond(InitProducerIdResult(ErrorCode.invalid_transaction_timeout))
            return
        part, error = self._lookup(transactional_id)
        if part is None:
            respond(InitProducerIdResult(error))
            return
        meta = part.txns.get(transactional_id)
        if meta is None:
            meta = TxnMetadata.new(transactional_id, self._next_producer_id(), timeout_ms, now_ms)
            part.txns[transactional_id] = meta

        if meta.pending is not None:
            respond(InitProducerIdResult(ErrorCode.concurrent_transactions))
            return
        if expected is not None and not _is_known_producer(meta, expected):
            respond(InitProducerIdResult(ErrorCode.producer_fenced))
            return
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            respond(InitProducerIdResult(ErrorCode.concurrent_transactions))
            return

        if meta.state is TxnState.ONGOING:
            # The previous instance left a transaction open: abort it under a bumped epoch
            # and let the client retry, which bumps again (or rotates the producer id).
            def fenced(error: ErrorCode) -> None:
                respond(InitProducerIdResult(
                    ErrorCode.concurrent_transactions if error is ErrorCode.none else error))
            self._prepare_commit_or_abort(part, meta, self._prepare_fence(meta, now_ms), fenced)
            return

        snapshot = self._init_transition(meta, timeout_ms, expected, now_ms)
        if snapshot is None:
            respond(InitProducerIdResult(ErrorCode.producer_fenced))
            return

        def durable(error: ErrorCode) -> None:
            if error is ErrorCode.none:
                respond(InitProducerIdResult(error, snapshot.producer_id, snapshot.producer_epoch))
            else:
                respond(InitProducerIdResult(error))
        self._append(part, meta, snapshot, durable)

    def _init_transition(self, meta: TxnMetadata, timeout_ms: int,
                         expected: tuple[int, int] | None, now_ms: int) -> TxnSnapshot | None:
        """The Empty state the producer gets, or None when `expected` names a fenced epoch."""
        epoch = meta.producer_epoch
        if expected is None or epoch == NO_PRODUCER_EPOCH or expected[1] == epoch:
            # A new producer, or a KIP-360 producer that holds the current epoch: bump. The
            # previous epoch is remembered only for the latter, so that its retry is recognized.
            last_epoch = NO_PRODUCER_EPOCH if expected is None else epoch
            if is_epoch_exhausted(epoch):
                return meta.prepare_producer_id_rotation(self._next_producer_id(), timeout_ms,
                                                         last_epoch, now_ms)
            return meta.prepare_epoch_bump(timeout_ms, last_epoch, now_ms)
        if expected[1] == meta.current.last_producer_epoch:
            # The producer's previous InitProducerId bumped the epoch but the answer was lost.
            return meta.prepare_init_retry(timeout_ms, now_ms)
        return None

    # AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition], now_ms: int,
                       respond: _ErrorCallback, transaction_version: int = 0) -> None:
        """Enlist partitions in the producer's transaction, starting it if needed.

        One error applies to every partition of the request, as in Kafka. Under transactions
        version 2 the partition leader asks this for the client, as its writes arrive.

        While the id's previous transaction writes its markers and Complete record, the request
        waits for that and then runs (Kafka answers CONCURRENT_TRANSACTIONS at once, and a client
        that begins its next transaction right after EndTxn retries after 20 ms, while the
        completion takes a few); a completion still going at the next `poll` has its waiting
        requests answered CONCURRENT_TRANSACTIONS.
        """
        wanted = frozenset(partitions)
        part, meta, error = self._producer_lookup(transactional_id, producer_id, producer_epoch)
        if error is ErrorCode.none and transactional_id in part.completing:
            part.completing[transactional_id].append((lambda: self.add_partitions(
                transactional_id, producer_id, producer_epoch, wanted, now_ms, respond, transaction_version),
                respond))
            return
        if error is ErrorCode.none:
            if meta.pending is not None or meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                error = ErrorCode.concurrent_transactions
            elif wanted <= meta.partitions:
                error = ErrorCode.none       # already enlisted (or nothing asked): no write
            else:
                self._append(part, meta, meta.prepare_add_partitions(wanted, now_ms, transaction_version), respond)
                return
        respond(error)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str, now_ms: int, respond: _ErrorCallback) -> None:
        """Enlist the group's `__consumer_offsets` partition, where TxnOffsetCommit will write."""
        offsets_partition = (GROUP_METADATA_TOPIC, partition_for(group_id, self._offsets_partitions))
        self.add_partitions(transactional_id, producer_id, producer_epoch, [offsets_partition],
                            now_ms, respond)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """KIP-890 part 1: may a transactional produce (or TxnOffsetCommit) write here?

        Without this check a produce that arrives after its transaction ended (or that the
        client never added) opens a transaction no coordinator will ever close, and the
        partition's LSO stops for good. Read-only; callers map the errors to their versions.
        """
        wanted = list(partitions)
        part, meta, error = self._producer_lookup(transactional_id, producer_id, producer_epoch)
        if error is ErrorCode.none and meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            error = ErrorCode.concurrent_transactions
        if error is not ErrorCode.none:
            return {tp: error for tp in wanted}
        ongoing = meta.state is TxnState.ONGOING
        return {tp: ErrorCode.none if ongoing and tp in meta.partitions else ErrorCode.invalid_txn_state
                for tp in wanted}

    def _producer_lookup(self, transactional_id: str, producer_id: int, producer_epoch: int
                         ) -> tuple[_Partition | None, TxnMetadata | None, ErrorCode]:
        part, error = self._lookup(transactional_id)
        if part is None:
            return None, None, error
        meta = part.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return part, None, ErrorCode.invalid_producer_id_mapping
        if meta.producer_epoch != producer_epoch:
            return part, None, ErrorCode.producer_fenced
        return part, meta, ErrorCode.none

    # EndTxn -------------------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, now_ms: int, respond: _ErrorCallback) -> None:
        """Commit or abort; answered once the Prepare record is durable (the decision point).

        A retry after the outcome is known is answered by the state: the same outcome
        succeeds (Complete) or is still in progress (Prepare -> CONCURRENT_TRANSACTIONS),
        the other outcome is INVALID_TXN_STATE.
        """
        part, meta, error = self._producer_lookup(transactional_id, producer_id, producer_epoch)
        if error is not ErrorCode.none:
            respond(error)
            return
        if meta.pending is not None:
            respond(ErrorCode.concurrent_transactions)
            return
        state = meta.state
        if state is TxnState.ONGOING:
            self._prepare_commit_or_abort(part, meta, meta.prepare_end(commit, now_ms), respond)
        elif state is TxnState.EMPTY or commit != (state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)):
            respond(ErrorCode.invalid_txn_state)
        elif state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            respond(ErrorCode.concurrent_transactions)
        else:
            respond(ErrorCode.none)

    def end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int,
                   commit: bool, now_ms: int, respond: Callable[[EndTxnResult], None]) -> None:
        """EndTxn v5 (transactions version 2): commit or abort under a bumped epoch, answered
        with the producer id and epoch the client goes on with, once the Prepare is durable.

        Retries and refusals: `TxnMetadata.check_end_v2`. At the last epoch the answer is the
        new producer id at epoch 0, which the Complete record moves to.
        """
        part, error = self._lookup(transactional_id)
        meta = part.txns.get(transactional_id) if part is not None else None
        if part is not None and meta is None:
            error = ErrorCode.invalid_producer_id_mapping
        if meta is None:
            respond(EndTxnResult(error))
            return
        refused = meta.check_end_v2(producer_id, producer_epoch, commit)
        if refused is not None:
            respond(refused)
            return
        next_producer_id = self._next_producer_id() if is_epoch_exhausted(meta.producer_epoch) else -1
        prepare = meta.prepare_end_v2(commit, next_producer_id, now_ms)

        def decided(error: ErrorCode) -> None:
            if error is not ErrorCode.none:
                respond(EndTxnResult(error))
            elif prepare.next_producer_id != -1:
                respond(EndTxnResult(error, prepare.next_producer_id, 0))
            else:
                respond(EndTxnResult(error, prepare.producer_id, prepare.producer_epoch))
        self._prepare_commit_or_abort(part, meta, prepare, decided)

    def _prepare_fence(self, meta: TxnMetadata, now_ms: int) -> TxnSnapshot:
        """The abort that fences the producer of an ongoing transaction (timeout, or a new
        instance's InitProducerId); a new producer id only when a version-2 double bump
        does not fit in the epochs left."""
        tv2_overflow = (meta.current.client_transaction_version >= 2
                        and meta.producer_epoch + 2 > MAX_PRODUCER_EPOCH)
        return meta.prepare_fence_and_abort(now_ms, self._next_producer_id() if tv2_overflow else -1)

    def _prepare_commit_or_abort(self, part: _Partition, meta: TxnMetadata, prepare: TxnSnapshot,
                                 respond: _ErrorCallback) -> None:
        def durable(error: ErrorCode) -> None:
            respond(error)
            if error is ErrorCode.none:
                self._write_markers(part, meta, prepare.last_update_ms)
        self._append(part, meta, prepare, durable)

    def _write_markers(self, part: _Partition, meta: TxnMetadata, now_ms: int) -> None:
        """Step 5.2, then 5.3. The Complete record carries the time the outcome was decided
        (or the partition loaded): callbacks bring no clock, and nothing reads it but expiry."""
        prepared = meta.current
        complete = meta.prepare_complete(now_ms)
        part.completing.setdefault(meta.transactional_id, [])

        def done(error: ErrorCode) -> None:
            if self._partitions.get(part.index) is not part:
                return
            if error is not ErrorCode.none:
                log.warning("giving up completing %s of %s: %s (a newer coordinator or epoch owns it)",
                            prepared.state.display_name, meta.transactional_id, error.name)
                meta.abandon(complete)
                self._run_held(part, meta.transactional_id)
                return
            self._append_complete(part, meta, complete)

        self._markers.write_markers(prepared.producer_id, prepared.producer_epoch,
                                    part.coordinator_epoch, prepared.state is TxnState.PREPARE_COMMIT,
                                    prepared.partitions, done, prepared.client_transaction_version)

    def _append_complete(self, part: _Partition, meta: TxnMetadata, complete: TxnSnapshot) -> None:
        part.completing.setdefault(meta.transactional_id, [])

        def durable(error: ErrorCode) -> None:
            # Markers are out; only the record is missing. Retried while the partition is ours.
            if error is not ErrorCode.none:
                log.warning("appending %s for %s failed (%s); retrying at the next poll",
                            complete.state.display_name, meta.transactional_id, error.name)
                self._unfinished.append((part, meta))
            if self._partitions.get(part.index) is part:
                self._run_held(part, meta.transactional_id)
        try:
            self._append(part, meta, complete, durable)
        except BaseException:
            self._run_held(part, meta.transactional_id)  # nothing completes: nobody waits for it
            raise

    @staticmethod
    def _run_held(part: _Partition, transactional_id: str) -> None:
        """The completion ended (or stopped): the requests that waited for it run now, against
        the state it left."""
        for retry, _ in part.completing.pop(transactional_id, ()):
            retry()

    @staticmethod
    def _refuse_held(part: _Partition, error: ErrorCode) -> None:
        for transactional_id, held in part.completing.items():
            part.completing[transactional_id] = []
            for _, respond in held:
                respond(error)

    # Durability ----------------------------------------------------------------------

    def _append(self, part: _Partition, meta: TxnMetadata, snapshot: TxnSnapshot,
                on_done: _ErrorCallback) -> None:
        """Write the pending `snapshot`; it becomes the state only once durable."""
        dead = snapshot.state is TxnState.DEAD
        # Version 1 (flexible) carries what transactions version 2 adds; version-1 transactions
        # are written as before.
        version = 1 if snapshot.client_transaction_version >= 2 else 0
        value = None if dead else encode_value(snapshot.log_value(), version)

        def durable(error: ErrorCode) -> None:
            if self._partitions.get(part.index) is not part:
                on_done(ErrorCode.not_coordinator)
                return
            if error is not ErrorCode.none:
                meta.abandon(snapshot)
                on_done(_APPEND_ERRORS.get(error, error))
                return
            meta.complete(snapshot)
            if dead:
                del part.txns[meta.transactional_id]
            on_done(ErrorCode.none)

        try:
            self._store.append(part.index, encode_key(meta.transactional_id), value, durable)
        except BaseException:
            # A store that fails without calling back must not leave the id blocked forever.
            meta.abandon(snapshot)
            raise

    # Timers ---------------------------------------------------------------------------

    def poll(self, now_ms: int) -> int:
        """Run the coordinator's timers; returns when it wants to be polled next.

        Answers CONCURRENT_TRANSACTIONS to the requests still waiting for a completion (its
        markers are being retried), aborts transactions that outlived their timeout (fencing
        their producer), retries Complete records whose append failed, and every
        `transaction.remove.expired.transaction.cleanup.interval.ms` removes ids idle for
        `transactional.id.expiration.ms`.
        """
        for part in self._partitions.values():
            self._refuse_held(part, ErrorCode.concurrent_transactions)
        self._abort_timed_out(now_ms)
        self._retry_unfinished(now_ms)
        if self._next_expiration_ms is None:
            self._next_expiration_ms = now_ms + self._expire_interval_ms
        elif now_ms >= self._next_expiration_ms:
            self._expire_transactional_ids(now_ms)
            self._next_expiration_ms = now_ms + self._expire_interval_ms
        return min(now_ms + self._abort_interval_ms, self._next_expiration_ms)

    def _loaded_txns(self) -> list[tuple[_Partition, TxnMetadata]]:
        return [(part, meta) for part in self._partitions.values() if not part.loading
                for meta in part.txns.values()]

    def _abort_timed_out(self, now_ms: int) -> None:
        for part, meta in self._loaded_txns():
            if (meta.state is TxnState.ONGOING and meta.pending is None
                    and meta.current.start_ms + meta.current.timeout_ms < now_ms):
                log.info("aborting transaction of %s (producer id %d, epoch %d): timed out after %d ms",
                         meta.transactional_id, meta.producer_id, meta.producer_epoch,
                         meta.current.timeout_ms)
                self._prepare_commit_or_abort(part, meta, self._prepare_fence(meta, now_ms),
                                              _log_failure(meta.transactional_id))

    def _retry_unfinished(self, now_ms: int) -> None:
        unfinished, self._unfinished = self._unfinished, []
        for part, meta in unfinished:
            if (self._partitions.get(part.index) is part and part.txns.get(meta.transactional_id) is meta
                    and meta.pending is None
                    and meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)):
                self._append_complete(part, meta, meta.prepare_complete(now_ms))

    def _expire_transactional_ids(self, now_ms: int) -> None:
        for part, meta in self._loaded_txns():
            if (meta.is_expirable and meta.pending is None
                    and meta.current.last_update_ms + self._expiration_ms <= now_ms):
                log.info("expiring transactional id %s (producer id %d), idle since %d",
                         meta.transactional_id, meta.producer_id, meta.current.last_update_ms)
                self._append(part, meta, meta.prepare_dead(), _log_failure(meta.transactional_id))

    # Admin APIs -----------------------------------------------------------------------

    def list_transactions(self, now_ms: int, state_filters: Iterable[str] = (),
                          producer_id_filters: Iterable[int] = (), duration_filter_ms: int = -1,
                          transactional_id_pattern: str | None = None) -> ListTransactionsResult:
        """ListTransactions over the partitions led here, with Kafka's filter semantics:
        empty filters match everything, unknown state names are reported back, the pattern
        must match the whole id, and the duration counts from the transaction's start."""
        if any(part.loading for part in self._partitions.values()):
            return ListTransactionsResult(ErrorCode.coordinator_load_in_progress)
        state_names = list(state_filters)
        states = {TxnState.from_name(name) for name in state_names} - {None}
        unknown = tuple(name for name in state_names if TxnState.from_name(name) is None)
        producer_ids = set(producer_id_filters)
        try:
            pattern = re.compile(transactional_id_pattern) if transactional_id_pattern else None
        except re.error:
            return ListTransactionsResult(ErrorCode.invalid_regular_expression)
        listed = []
        for _, meta in self._loaded_txns():
            if ((producer_ids and meta.producer_id not in producer_ids)
                    or (state_names and meta.state not in states)
                    or (duration_filter_ms >= 0 and now_ms - meta.current.start_ms <= duration_filter_ms)
                    or (pattern is not None and not pattern.fullmatch(meta.transactional_id))):
                continue
            listed.append(TxnListing(meta.transactional_id, meta.producer_id, meta.state.display_name))
        return ListTransactionsResult(ErrorCode.none, unknown, tuple(listed))

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        described = []
        for transactional_id in transactional_ids:
            part, error = self._lookup(transactional_id)
            meta = part.txns.get(transactional_id) if part is not None else None
            if part is not None and meta is None:
                error = ErrorCode.transactional_id_not_found
            if meta is None:
                described.append(TxnDescription(transactional_id, error))
                continue
            current = meta.current
            described.append(TxnDescription(
                transactional_id, ErrorCode.none, state=current.state.display_name,
                timeout_ms=current.timeout_ms, start_ms=current.start_ms,
                producer_id=current.producer_id, producer_epoch=current.producer_epoch,
                partitions=current.partitions,
            ))
        return described


def _is_known_producer(meta: TxnMetadata, expected: tuple[int, int]) -> bool:
    """KIP-360: may the producer holding `expected` re-initialize this id?

    Yes for an id never initialized, for the current producer id (the epoch is checked when
    bumping), and for the previous producer id when its epochs ran out (a retry of the
    InitProducerId that rotated it, whose answer was lost).
    """
    producer_id, epoch = expected
    return (meta.producer_epoch == NO_PRODUCER_EPOCH
            or producer_id == meta.producer_id
            or (producer_id == meta.current.last_producer_id and is_epoch_exhausted(epoch)))


def _log_failure(transactional_id: str) -> _ErrorCallback:
    """For changes the coordinator starts itself: nobody waits for them, and the timer that
    started them tries again while the condition still holds."""
    def on_done(error: ErrorCode) -> None:
        if error is not ErrorCode.none:
            log.warning("timer-driven change of %s failed: %s", transactional_id, error.name)
    return on_done
