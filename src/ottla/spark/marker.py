"""The exactly-once write task's marker protocol (sink.py's module docstring has it whole), written once for
both of its producers: Ottla's own (transactional.Task) and confluent-kafka's (rdkafka.TransactionalTask).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .options import WriteOptions

__all__ = ["MarkerTask"]


class MarkerTask(ABC):
    """One transactional id's producer, which the Python worker keeps between micro-batches of its Spark
    partition (sink.py's `_checkin`) so that a task skips the producer's set-up.

    Only a producer whose last transaction committed (or that never began one) is kept. A kept producer may
    have been fenced since: another worker ran the same Spark partition and initialised the id. `begin` finds
    out when it adds the marker to the transaction, before any row is sent, and then fences that worker in
    turn with a new producer and reads the marker again.

    A subclass has `producer` and says how its client reads the marker (`_read_marker`), opens a transaction
    with the marker in it (`_open`, raising `fenced`), replaces a fenced producer (`_fence_again`) and
    commits (`_commit`).
    """

    fenced: type[Exception]  # what `_open` raises when another producer of the id initialised since

    def __init__(self, ident: str, options: WriteOptions):
        self.ident, self.options = ident, options
        self.last_committed: int | None = None  # the last batch committed, by this producer or before it began
        self.kept = False

    def begin(self, batch_id: int) -> bool:
        """Open the transaction of micro-batch `batch_id` with its marker (offset batch_id + 1) in it;
        False if an earlier attempt already committed that batch."""
        while True:
            if not self.kept or self.last_committed is None:
                # Read once this producer is the id's current epoch: whoever commits a marker after this read
                # fences this producer first, so the kept producer knows the marker from here on.
                self.last_committed = self._read_marker() - 1
            # Else no other producer of this id committed since ours unless it fenced ours, which `_open`
            # finds out; so the marker is our last commit's, or we look again.
            if self.last_committed >= batch_id:
                return False
            try:
                self._open(batch_id + 1)
                return True
            except self.fenced:
                if not self.kept:
                    raise
                self._fence_again()  # fenced while kept: fence in turn, look again
                self.kept, self.last_committed = False, None

    def commit(self, batch_id: int) -> None:
        self._commit()
        self.last_committed = batch_id

    @abstractmethod
    def _read_marker(self) -> int:
        """The committed offset of group `ident` on partition 0 of the marker topic (negative: none)."""

    @abstractmethod
    def _open(self, offset: int) -> None:
        """Begin a transaction and commit `offset` for group `ident` (the marker) with it."""

    @abstractmethod
    def _fence_again(self) -> None:
        """Replace the fenced producer by a new one, which fences the id's other producers."""

    @abstractmethod
    def _commit(self) -> None:
        """Commit the open transaction once every row sent is written: rows and marker become visible."""
