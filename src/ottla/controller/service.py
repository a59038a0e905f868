"""The controller's asyncio edge: every broker of a cluster runs one, and it is the
controller while it holds `/controller`.

The `Controller` state machine calls the blocking store, so every call into it runs on one
worker thread, one at a time (Kafka's single controller event thread). Store watches fire
on the store's thread and are handed to the loop with `call_soon_threadsafe`, queued (one
pending event per kind: a watch means "re-read"), and run in order. The requests an event
produces go to one queue per destination broker and are sent in order, each retried until
it is delivered, its broker leaves, or this broker stops being controller for that epoch
(Kafka's `ControllerChannelManager`). StopReplica answers come back as events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterable, Mapping

from ..cluster.store import ClusterStore, StoreError, TopicPartition
from ..errors import ErrorCode
from .context import ControllerConfig
from .controller import Controller
from .requests import ControllerRequest

__all__ = ["ControllerService", "Sender"]

log = logging.getLogger("ottla.controller")

# Sends one request to its destination and returns, for a StopReplica, the per-partition
# error codes; raises OSError / asyncio.TimeoutError when the broker cannot be reached.
Sender = Callable[[ControllerRequest], Awaitable[Any]]

WATCHED = {
    "brokers": "on_brokers_changed",
    "controller": "on_controller_changed",
    "topics": "on_topics_changed",
    "topic_deletions": "on_topic_deletions",
    "isr_changes": "on_isr_changes",
    "partition_reassignment": "on_reassignment_request",
    "preferred_replica_election": "on_preferred_election",
    "config_changes": "on_config_changes",
}
EVENTS = {**WATCHED, "tick": "tick", "resync": "resync"}
RETRY_BACKOFF_S = 0.2
STORE_RETRY_S = 1.0
# How long a stopping controller goes on delivering what it already decided; a broker that
# does not answer by then gets the state from the next controller's failover.
DRAIN_TIMEOUT_S = 5.0


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ControllerService:
    def __init__(self, broker_id: int, store: ClusterStore, config: ControllerConfig, send: Sender,
                 *, tick_interval_s: float = 1.0, clock_ms: Callable[[], int] = monotonic_ms):
        self.broker_id = broker_id
        self.store = store
        self.controller = Controller(broker_id, store, config)
        self._send = send
        self._tick_interval_s = tick_interval_s
        self._clock_ms = clock_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ottla-controller")
        self._events: asyncio.Queue | None = None
        self._pending: set[str] = set()
        self._outboxes: dict[int, asyncio.Queue] = {}
        self._tasks: list[asyncio.Task] = []
        self._stopped = False

    @property
    def active(self) -> bool:
        return self.controller.active

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        # Each batch is queued for sending as it closes, from the worker thread, in order; what
        # an event returns is queued after (its result reaches the loop after those callbacks).
        self.controller.sink = self._dispatch_threadsafe
        self._events = asyncio.Queue()
        for target in WATCHED:
            self.store.watch(target, lambda t=target: self._post_threadsafe(t))
        self.store.on_session_lost(lambda: self._post_threadsafe("session_lost"))
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._ticker())]
        self._post("controller")

    async def stop(self) -> None:
        """Stop acting (before the store closes, which also ends `/controller`); an active
        controller first delivers the requests it already decided. They matter most when it
        stops after its own controlled shutdown: the LeaderAndIsr that makes the new leaders
        lead (and load the coordinators' partitions) and the UpdateMetadata that sends clients
        to them. Dropped, the partitions' state in ZooKeeper named leaders that did not know
        it, whose coordinators answered NOT_COORDINATOR until the next controller's failover."""
        if self.controller.active:
            await self._drain()
        self._stopped = True
        for task in self._tasks + [t for t, _ in self._outboxes.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *[t for t, _ in self._outboxes.values()], return_exceptions=True)
        if self.controller.active and self.store.connected:  # else the session's end removes /controller
            try:
                await self._call(self.controller.resign)
            except StoreError as exc:
                log.warning("controller: resigning failed (%s); the session end removes /controller", exc)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _drain(self) -> None:
        joins = {broker_id: self._loop.create_task(queue.join()) for broker_id, (_, queue) in self._outboxes.items()}
        if not joins:
            return
        _, pending = await asyncio.wait(joins.values(), timeout=DRAIN_TIMEOUT_S)
        for join in pending:
            join.cancel()
        if pending:
            log.warning("controller: stopping with requests undelivered to brokers %s",
                        sorted(b for b, join in joins.items() if join in pending))

    def _post_threadsafe(self, event: str) -> None:
        if not self._stopped:
            self._loop.call_soon_threadsafe(self._post, event)

    def _dispatch_threadsafe(self, requests: list[ControllerRequest]) -> None:
        if not self._stopped:
            self._loop.call_soon_threadsafe(self.dispatch, requests)

    def _post(self, event: str) -> None:
        if self._stopped or event in self._pending:
            return
        self._pending.add(event)
        self._events.put_nowait(event)

    def set_unclean_default(self, enabled: bool) -> None:
        """The broker's dynamic unclean.leader.election.enable changed (`server/dynamic_configs`):
        turned on, an active controller elects the Offline partitions it allows now."""
        if self.controller.set_unclean_default(enabled) and self._events is not None:
            self._post("config_changes")

    async def _call(self, fn, *args):
        return await self._loop.run_in_executor(self._executor, fn, *args)

    async def _run(self) -> None:
        while True:
            event = await self._events.get()
            self._pending.discard(event)
            started = time.monotonic()
            if event != "tick":
                log.debug("controller: %s event", event)
            try:
                if event == "session_lost":
                    await self._call(self.controller.on_session_lost)
                    self._post("controller")  # stand again once the new session is up
                    continue
                method = getattr(self.controller, EVENTS[event])
                requests = await self._call(method, self._clock_ms())
            except StoreError as exc:
                # An event cut off part-way may have changed the context but not the cluster
                # (the broker change is seen, the elections it needs are not written): re-read
                # everything rather than replay an event that would now find nothing new.
                retry = event if event in ("controller", "resync") or not self.controller.active else "resync"
                log.warning("controller: %s could not reach the store (%s); %s", event, exc,
                            "retrying" if retry == event else "re-reading the cluster")
                self._loop.call_later(STORE_RETRY_S, self._post, retry)
                continue
            except Exception:
                log.exception("controller: handling %s failed", event)
                continue
            if event != "tick" or requests:
                log.debug("controller: %s handled in %.0f ms, %d requests", event,
                          (time.monotonic() - started) * 1000, len(requests))
            self.dispatch(requests)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self._tick_interval_s)
            if self.controller.active:
                self._post("tick")

    # -- sending ---------------------------------------------------------------------------
    def dispatch(self, requests: Iterable[ControllerRequest]) -> None:
        for request in requests:
            entry = self._outboxes.get(request.destination)
            if entry is None:
                queue: asyncio.Queue = asyncio.Queue()
                task = self._loop.create_task(self._send_loop(request.destination, queue))
                entry = self._outboxes[request.destination] = (task, queue)
            entry[1].put_nowait(request)

    def _relevant(self, request: ControllerRequest) -> bool:
        ctx = self.controller.ctx
        if ctx is None or ctx.epoch.epoch != request.payload.controller_epoch:
            return False
        broker = ctx.brokers.get(request.destination)
        return broker is not None and broker.epoch == request.payload.broker_epoch

    async def _send_loop(self, destination: int, queue: asyncio.Queue) -> None:
        while True:
            request = await queue.get()
            answer = None
            while self._relevant(request):
                try:
                    answer = await self._send(request)
                    break
                except (OSError, asyncio.TimeoutError, EOFError) as exc:
                    log.debug("controller: %s to broker %d failed (%s); retrying", request.kind, destination, exc)
                    await asyncio.sleep(RETRY_BACKOFF_S)
                except Exception:
                    # A request that cannot even be sent must not end the channel: every later
                    # request to this broker would wait behind it forever.
                    log.exception("controller: %s to broker %d cannot be sent; dropped", request.kind, destination)
                    break
            if request.kind == "StopReplica" and answer is not None:
                await self._stop_replica_answered(destination, answer)
            queue.task_done()

    async def _stop_replica_answered(self, broker_id: int, errors: Mapping[TopicPartition, int]) -> None:
        try:
            requests = await self._call(self.controller.on_stop_replica_response, broker_id, dict(errors),
                                        self._clock_ms())
        except StoreError as exc:
            log.warning("controller: StopReplica answer from %d not applied (%s)", broker_id, exc)
            return
        self.dispatch(requests)

    # -- requests from brokers and clients (handlers call these) -------------------------
    async def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> tuple[ErrorCode, set[TopicPartition]]:
        error, remaining, requests = await self._call(self.controller.controlled_shutdown, broker_id,
                                                      broker_epoch, self._clock_ms())
        self.dispatch(requests)
        return error, remaining

    async def elect_leaders(self, partitions: list[TopicPartition], election: str):
        results, requests = await self._call(self.controller.elect_leaders, partitions, election, self._clock_ms())
        self.dispatch(requests)
        return results

    async def alter_reassignments(self, targets: Mapping[TopicPartition, tuple[int, ...] | None],
                                  allow_rf_change: bool = True):
        results, requests = await self._call(self.controller.alter_reassignments, dict(targets), self._clock_ms(),
                                             allow_rf_change)
        self.dispatch(requests)
        return results

    async def list_reassignments(self, partitions: list[TopicPartition] | None):
        return await self._call(self.controller.list_reassignments, partitions)
