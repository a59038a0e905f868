"""Per-transactional-id state and Kafka's rules for moving between states.

A `TxnMetadata` holds the durable state (`current`) and at most one transition that has been
decided but is not yet durable (`pending`). Transitions never touch `current` until the
coordinator reports the log append durable, so a failed append leaves nothing to undo and a
client is never told about a state a restarted coordinator would not find in the log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ...errors import ErrorCode
from .log_format import TopicPartition, TxnLogValue, TxnState, decode_records

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = 32767

_EXPIRABLE = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})

# Kafka's TransactionState.validPreviousStates (see the coordinator's module docstring).
# PrepareEpochFence is never held as a state here: the fence and the abort it forces are one
# durable transition, Ongoing -> PrepareAbort with a bumped epoch. Dead is only ever pending:
# its durable form is the tombstone. Transactions version 2 may also abort from Empty and
# Complete* (`_TV2_EMPTY_ABORT`): partitions join implicitly, so the client cannot know
# whether its transaction reached the coordinator.
_VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: _EXPIRABLE,
    TxnState.ONGOING: _EXPIRABLE | {TxnState.ONGOING},
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: _EXPIRABLE,
}
_TV2_EMPTY_ABORT = _EXPIRABLE


def is_epoch_exhausted(epoch: int) -> bool:
    """One epoch is kept in reserve so that fencing an Ongoing transaction can always bump."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    """EndTxn v5's answer: the producer id and epoch the client continues with."""
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class IllegalTransition(Exception):
    """A coordinator bug: a transition the state machine forbids. Never a client error."""


@dataclass(frozen=True, slots=True)
class TxnSnapshot:
    """The state of one transactional id, as stored (or about to be stored) in the log."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int
    # Transactions version 2: the producer id the Complete record moves to when EndTxn ran out
    # of epochs, and the version of the protocol the transaction runs under (its markers' too).
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0

    def log_value(self) -> TxnLogValue:
        return TxnLogValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            timeout_ms=self.timeout_ms,
            state=self.state,
            partitions=self.partitions,
            last_update_ms=self.last_update_ms,
            start_ms=self.start_ms,
            previous_producer_id=self.last_producer_id,
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version,
        )


class TxnMetadata:
    """Durable state of a transactional id plus the one transition waiting to become durable."""

    __slots__ = ("transactional_id", "current", "pending")

    def __init__(self, transactional_id: str, current: TxnSnapshot):
        self.transactional_id = transactional_id
        self.current = current
        self.pending: TxnSnapshot | None = None

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int) -> "TxnMetadata":
        """A first-seen id: epoch -1, so that the first InitProducerId hands out epoch 0."""
        return cls(transactional_id, TxnSnapshot(
            producer_id=producer_id, last_producer_id=NO_PRODUCER_ID,
            producer_epoch=NO_PRODUCER_EPOCH, last_producer_epoch=NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(),
            start_ms=-1, last_update_ms=now_ms,
        ))

    @classmethod
    def from_log(cls, transactional_id: str, value: TxnLogValue) -> "TxnMetadata":
        # The log does not keep the last epoch; Kafka loads it as unknown too.
        return cls(transactional_id, TxnSnapshot(
            producer_id=value.producer_id, last_producer_id=value.previous_producer_id,
            producer_epoch=value.producer_epoch, last_producer_epoch=NO_PRODUCER_EPOCH,
            timeout_ms=value.timeout_ms, state=value.state, partitions=value.partitions,
            start_ms=value.start_ms, last_update_ms=value.last_update_ms,
            next_producer_id=value.next_producer_id, client_transaction_version=value.client_transaction_version,
        ))

    # Read access to the durable state ------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self.current.state

    @property
    def producer_id(self) -> int:
        return self.current.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.current.producer_epoch

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return self.current.partitions

    @property
    def is_expirable(self) -> bool:
        return self.state in _EXPIRABLE

    # Transitions ----------------------------------------------------------------------

    def _prepare(self, state: TxnState, allowed: frozenset[TxnState] = frozenset(), **changes) -> TxnSnapshot:
        if self.pending is not None:
            raise IllegalTransition(f"{self.transactional_id}: transition to {state.display_name} "
                                    f"while {self.pending.state.display_name} is pending")
        if self.state not in _VALID_PREVIOUS[state] | allowed:
            raise IllegalTransition(f"{self.transactional_id}: {self.state.display_name} -> "
                                    f"{state.display_name}")
        self.pending = replace(self.current, state=state, **changes)
        return self.pending

    def prepare_epoch_bump(self, timeout_ms: int, last_epoch: int, now_ms: int) -> TxnSnapshot:
        """InitProducerId on a finished transaction: same producer id, next epoch."""
        if is_epoch_exhausted(self.producer_epoch):
            raise IllegalTransition(f"{self.transactional_id}: epoch {self.producer_epoch} is exhausted")
        return self._prepare(TxnState.EMPTY, producer_epoch=self.producer_epoch + 1,
                             last_producer_epoch=last_epoch, timeout_ms=timeout_ms,
                             partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)

    def prepare_init_retry(self, timeout_ms: int, now_ms: int) -> TxnSnapshot:
        """KIP-360: a retried InitProducerId whose earlier bump succeeded gets the same epoch."""
        return self._prepare(TxnState.EMPTY, timeout_ms=timeout_ms, partitions=frozenset(),
                             start_ms=-1, last_update_ms=now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int,
                                     last_epoch: int, now_ms: int) -> TxnSnapshot:
        """Epochs ran out: continue under a fresh producer id, starting again at epoch 0."""
        return self._prepare(TxnState.EMPTY, producer_id=new_producer_id,
                             last_producer_id=self.producer_id, producer_epoch=0,
                             last_producer_epoch=last_epoch, timeout_ms=timeout_ms,
                             partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)

    def prepare_add_partitions(self, partitions: frozenset[TopicPartition], now_ms: int,
                               transaction_version: int = 0) -> TxnSnapshot:
        # The transaction (and its timeout) starts with its first partition.
        start_ms = self.current.start_ms if self.state is TxnState.ONGOING else now_ms
        return self._prepare(TxnState.ONGOING, partitions=self.partitions | partitions,
                             start_ms=start_ms, last_update_ms=now_ms,
                             client_transaction_version=transaction_version)

    def prepare_end(self, commit: bool, now_ms: int) -> TxnSnapshot:
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return self._prepare(state, last_update_ms=now_ms, client_transaction_version=0)

    def check_end_v2(self, producer_id: int, producer_epoch: int, commit: bool) -> EndTxnResult | None:
        """Kafka's rules for EndTxn v5; None when it ends the transaction (`prepare_end_v2`).

        The epoch is bumped every time, so the state and the epoch tell a retry from the next
        transaction's EndTxn: a retry holds the epoch just below the current one (or, after
        the epochs ran out, the previous producer id's last one) and gets the outcome already
        decided. An abort is accepted without any partition added (from Empty or Complete*).
        """
        current, state = self.current, self.state
        preparing = state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
        retry_on_bump = producer_id == current.producer_id and current.producer_epoch == producer_epoch + 1
        retry_on_rotation = (producer_id != current.producer_id and producer_id == current.last_producer_id
                             and producer_epoch == MAX_PRODUCER_EPOCH - 1 and current.producer_epoch == 0)
        if preparing:
            valid_epoch = retry_on_bump
        elif state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            valid_epoch = retry_on_bump or retry_on_rotation or producer_epoch == current.producer_epoch
        else:
            valid_epoch = producer_epoch == current.producer_epoch
        if producer_id != current.producer_id and not retry_on_rotation:
            return EndTxnResult(ErrorCode.invalid_producer_id_mapping)
        if not valid_epoch:
            return EndTxnResult(ErrorCode.producer_fenced)
        if self.pending is not None:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        if preparing:
            same = commit == (state is TxnState.PREPARE_COMMIT)
            return EndTxnResult(ErrorCode.concurrent_transactions if same else ErrorCode.invalid_txn_state)
        if retry_on_bump or retry_on_rotation:
            # The outcome is decided: the same one again succeeds with what the client should hold.
            if state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
                return EndTxnResult(ErrorCode.none, current.producer_id, current.producer_epoch)
            return EndTxnResult(ErrorCode.invalid_txn_state)
        if commit and state is not TxnState.ONGOING:
            return EndTxnResult(ErrorCode.invalid_txn_state)
        return None

    def prepare_end_v2(self, commit: bool, next_producer_id: int, now_ms: int) -> TxnSnapshot:
        """Transactions version 2 (KIP-890 part 2): every commit or abort bumps the epoch, and the
        markers carry the bumped one, so a late write of the transaction just ended is refused
        by its partitions. `next_producer_id` (else NO_PRODUCER_ID) is where the Complete record
        moves when the epochs ran out. An abort from Empty or Complete* ends a transaction that
        never added a partition; it starts now."""
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        started = self.state is TxnState.ONGOING
        # Rotating, the id the client holds becomes the previous one: its EndTxn retry is recognized.
        previous = self.current.last_producer_id if next_producer_id == NO_PRODUCER_ID else self.producer_id
        return self._prepare(state, allowed=frozenset() if commit else _TV2_EMPTY_ABORT,
                             producer_epoch=self.producer_epoch + 1, last_producer_epoch=self.producer_epoch,
                             last_producer_id=previous, next_producer_id=next_producer_id,
                             client_transaction_version=2,
                             start_ms=self.current.start_ms if started else now_ms, last_update_ms=now_ms)

    def prepare_fence_and_abort(self, now_ms: int, next_producer_id: int = NO_PRODUCER_ID) -> TxnSnapshot:
        """Abort the ongoing transaction under a bumped epoch, fencing the producer that owns it.

        The markers then carry the new epoch, so the partitions reject the old producer too.
        An Ongoing transaction never holds the last epoch: InitProducerId rotates the producer
        id before handing it out (`is_epoch_exhausted`).

        A transactions-version-2 transaction is bumped twice, as Kafka does: one bump is what
        its own EndTxn would make, and a retry of that EndTxn (epoch one below) must not pass
        as the fenced producer's. Where two bumps do not fit (the transaction holds the last
        epoch but one), the Complete record moves to `next_producer_id`, and the previous
        producer id is forgotten so that the fenced producer cannot claim the new one.
        """
        if self.producer_epoch >= MAX_PRODUCER_EPOCH:
            raise IllegalTransition(f"{self.transactional_id}: cannot fence epoch {self.producer_epoch}")
        if self.current.client_transaction_version < 2:
            return self._prepare(TxnState.PREPARE_ABORT, producer_epoch=self.producer_epoch + 1,
                                 last_producer_epoch=NO_PRODUCER_EPOCH, last_update_ms=now_ms)
        if self.producer_epoch + 2 <= MAX_PRODUCER_EPOCH:
            return self._prepare(TxnState.PREPARE_ABORT, producer_epoch=self.producer_epoch + 2,
                                 last_producer_epoch=self.producer_epoch + 1, last_update_ms=now_ms)
        return self._prepare(TxnState.PREPARE_ABORT, producer_epoch=MAX_PRODUCER_EPOCH,
                             last_producer_epoch=NO_PRODUCER_EPOCH, last_producer_id=NO_PRODUCER_ID,
                             next_producer_id=next_producer_id, last_update_ms=now_ms)

    def prepare_complete(self, now_ms: int) -> TxnSnapshot:
        if self.state is TxnState.PREPARE_COMMIT:
            state = TxnState.COMPLETE_COMMIT
        elif self.state is TxnState.PREPARE_ABORT:
            state = TxnState.COMPLETE_ABORT
        else:
            raise IllegalTransition(f"{self.transactional_id}: nothing to complete in {self.state.display_name}")
        rotation = {}
        if self.current.next_producer_id != NO_PRODUCER_ID:
            # The epochs ran out: continue under the new producer id at epoch 0 (the previous id
            # was set by the Prepare, so that it survives a reload).
            rotation = dict(producer_id=self.current.next_producer_id, producer_epoch=0,
                            next_producer_id=NO_PRODUCER_ID)
        return self._prepare(state, partitions=frozenset(), last_update_ms=now_ms, **rotation)

    def prepare_dead(self) -> TxnSnapshot:
        return self._prepare(TxnState.DEAD)

    def complete(self, snapshot: TxnSnapshot) -> None:
        """The pending transition is durable: it becomes the state."""
        if self.pending is not snapshot:
            raise IllegalTransition(f"{self.transactional_id}: completing a transition that is not pending")
        self.current = snapshot
        self.pending = None

    def abandon(self, snapshot: TxnSnapshot) -> None:
        """The pending transition could not be made durable: forget it."""
        if self.pending is snapshot:
            self.pending = None


def loaded_txns(records: Iterable[tuple[bytes, bytes | None]]) -> dict[str, TxnMetadata]:
    """A `__transaction_state` partition's (key, value) records, in log order, as each id's
    state: its last record wins, a tombstone removes it (Kafka's loadTransactionMetadata)."""
    return {transactional_id: TxnMetadata.from_log(transactional_id, value)
            for transactional_id, value in decode_records(records).items()}
