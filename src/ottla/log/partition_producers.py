"""A partition log's producer state as its log holds it: loaded on first use, rebuilt after a
truncation, both in steps an event loop can turn between (Kafka's UnifiedLog keeps its
ProducerStateManager and rebuilds it in `loadProducerState`)."""

from __future__ import annotations

from typing import Callable, Generator, Iterable

from ..producer_state.manager import Batch, ProducerStateManager

__all__ = ["PartitionProducers"]


class PartitionProducers:
    """Owns one log's `ProducerStateManager` and the rebuild of it still pending, if any.

    `new_state()` makes an empty manager for the log's directory; `bounds()` is the log's
    (log start offset, log end offset) now; `replay(offset)` yields its batches from `offset`.
    The log keeps the batches a pending rebuild reads unchanged (`finish` before changing them).
    """

    def __init__(
        self,
        new_state: Callable[[], ProducerStateManager],
        bounds: Callable[[], tuple[int, int]],
        replay: Callable[[int], Iterable[Batch]],
        loaded: ProducerStateManager | None = None,
    ):
        self._new_state = new_state
        self._bounds = bounds
        self._replay = replay
        self._state = loaded  # None: not loaded yet (a clean start reads no snapshot of idle partitions)
        self._pending: Generator[None, None, object] | None = None
        self._loading = False  # `_pending` is the first load: `_state` is dropped if it fails

    @property
    def ready(self) -> bool:
        """Loaded, and no rebuild pending: using the state now costs nothing more."""
        return self._state is not None and self._pending is None

    @property
    def state(self) -> ProducerStateManager:
        """Loaded on first use; a rebuild or first load still pending is finished first."""
        self.finish(load=True)
        return self._state

    @property
    def created(self) -> ProducerStateManager | None:
        """The manager if one exists (loaded, or a rebuild of it pending), without loading it."""
        return self._state

    def step(self, *, load: bool = False) -> bool:
        """One step of the rebuild a truncation left pending, or with `load` of the first load
        (started here: a snapshot read, then RELOAD_STEP_BATCHES batches replayed per step);
        False once the state is ready. An unreadable batch is raised once, as a rebuild in one
        piece raises it; a first load that fails is dropped and starts over when next needed."""
        if load and self._state is None:
            self._state = self._new_state()
            self._pending = self._state.reload_in_steps(*self._bounds(), self._replay)
            self._loading = True
        steps = self._pending
        if steps is None:
            return False
        try:
            next(steps)
            return True
        except BaseException as exc:
            self._pending = None
            if self._loading:
                self._loading = False
                if not isinstance(exc, StopIteration):
                    self._state = None
            if isinstance(exc, StopIteration):
                return False
            raise

    def finish(self, *, load: bool = False) -> None:
        """Before the segments a pending rebuild reads change, or the state is used."""
        while self.step(load=load):
            pass

    def reload(self) -> None:
        """The log was truncated: rebuild from the newest snapshot below its end, in steps
        (`step`). A rebuild still pending is dropped: this one starts over from a snapshot."""
        if self._state is None:
            self._state = self._new_state()
        self._pending = self._state.reload_in_steps(*self._bounds(), self._replay)
        self._loading = False

    def drop_pending(self) -> None:
        """The partition is deleted: nothing is left to rebuild from."""
        if self._loading:
            self._state, self._loading = None, False
        self._pending = None
