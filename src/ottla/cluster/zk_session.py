"""A kazoo session with the request discipline `ZkClusterStore` builds on.

Every request blocks for one or a few round trips and gives up after
`zookeeper.connection.timeout.ms` with `StoreUnavailable`; a request lost with its connection
is sent again. Many requests are pipelined (`_many`, `_commit_many`), as Kafka's
`ZooKeeperClient` does. A controller's multi starts with a check of `/controller_epoch`'s
version (`_commit`), so a deposed controller's writes are refused as `ControllerMoved`.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from typing import Any, Callable, Iterable, Mapping

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (BadVersionError, ConnectionClosedError, ConnectionLoss, KazooException,
                              NodeExistsError, NoNodeError, OperationTimeoutError, RolledBackError,
                              RuntimeInconsistency, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from .store import ControllerEpoch, ControllerMoved, StoreUnavailable
from .zk_data import CONTROLLER_EPOCH, split_chroot, to_json

RETRY_BACKOFF_S = 0.1


class ZkSession:
    """One ZooKeeper session and the plumbing to use it; `ZkClusterStore` adds Kafka's layout."""

    def __init__(self, connect: str, *, session_timeout_ms: int, connection_timeout_ms: int | None,
                 persistent_paths: Iterable[str]):
        """Connect (StoreUnavailable if no ZooKeeper answers), then create `persistent_paths`."""
        # Kafka: zookeeper.connection.timeout.ms defaults to zookeeper.session.timeout.ms.
        self.connect = connect
        self._timeout = (connection_timeout_ms if connection_timeout_ms is not None else session_timeout_ms) / 1000
        self._session_lost: list[Callable[[], None]] = []
        self._closing = False
        self._zk = KazooClient(hosts=connect, timeout=session_timeout_ms / 1000,
                               connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))
        try:
            with warnings.catch_warnings():  # kazoo warns of a missing chroot; we report it below
                warnings.simplefilter("ignore", UserWarning)
                self._zk.start(timeout=self._timeout)
        except KazooTimeoutError:
            self._zk.stop()
            self._zk.close()
            raise StoreUnavailable(f"zookeeper.connect={connect}: no ZooKeeper answered within "
                                   f"{int(self._timeout * 1000)} ms") from None
        try:
            hosts, chroot = split_chroot(connect)
            if chroot is not None and self._call("exists", "/") is None:
                raise StoreUnavailable(f"zookeeper.connect={connect}: chroot {chroot} does not exist in "
                                       f"ZooKeeper at {hosts}; create it first")
            for path in persistent_paths:
                self._call("ensure_path", path)
        except BaseException:
            self.close()
            raise
        self._zk.add_listener(self._state_changed)

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, operation: str, *args, **kwargs):
        """One kazoo operation by name (`"get"`, `"create"`, ...); see `_wait`."""
        return self._wait(lambda: getattr(self._zk, operation + "_async")(*args, **kwargs))

    def _wait(self, start: Callable[[], Any]):
        """Start an operation and wait for it, again after a lost connection or session, until
        the connection timeout; then StoreUnavailable. kazoo keeps a request queued while it
        reconnects, so a write that timed out may still apply later (fenced writes stay fenced)."""
        deadline = time.monotonic() + self._timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreUnavailable(f"ZooKeeper at {self.connect} did not answer within "
                                       f"{int(self._timeout * 1000)} ms")
            try:
                return start().get(timeout=remaining)
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
                time.sleep(min(RETRY_BACKOFF_S, max(0.0, deadline - time.monotonic())))
            except KazooTimeoutError:
                continue  # the deadline check above reports it
            except ConnectionClosedError:
                raise StoreUnavailable(f"ZooKeeper at {self.connect}: the store is closed") from None

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            return self._call("get", path)
        except NoNodeError:
            return None

    def _delete_if_exists(self, path: str) -> None:
        try:
            self._call("delete", path)
        except NoNodeError:
            pass  # already gone (another broker, or never there)

    def _children(self, path: str) -> list[str]:
        try:
            return self._call("get_children", path)
        except NoNodeError:
            return []

    def _many(self, operation: str, paths: list[str], **kwargs) -> dict[str, Any]:
        """The same operation on many paths, pipelined (as Kafka's ZooKeeperClient does): one
        round trip's latency instead of one per path. A missing node gives None (NodeExists
        too, for creates); a path whose request was lost is done again on its own."""
        pending = [(path, getattr(self._zk, operation + "_async")(path, **kwargs)) for path in paths]
        results: dict[str, Any] = {}
        for path, request in pending:
            try:
                results[path] = request.get(timeout=self._timeout)
            except (NoNodeError, NodeExistsError):
                results[path] = None
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
                try:
                    results[path] = self._call(operation, path, **kwargs)
                except (NoNodeError, NodeExistsError):
                    results[path] = None
            except KazooTimeoutError:
                raise StoreUnavailable(f"ZooKeeper at {self.connect} did not answer within "
                                       f"{int(self._timeout * 1000)} ms") from None
            except ConnectionClosedError:
                raise StoreUnavailable(f"ZooKeeper at {self.connect}: the store is closed") from None
        return results

    def _commit(self, ops: Callable[[Any], None], epoch: ControllerEpoch | None) -> list:
        """Run `ops(transaction)` as one multi, first checking the controller epoch's version.
        Returns the results of `ops`' own operations; raises the first failure."""
        return self._outcome(self._wait(lambda: self._start_multi(ops, epoch)), epoch)

    def _start_multi(self, ops: Callable[[Any], None], epoch: ControllerEpoch | None):
        txn = self._zk.transaction()
        if epoch is not None:
            txn.check(CONTROLLER_EPOCH, epoch.version)
        ops(txn)
        return txn.commit_async()

    def _commit_many(self, multis: Mapping[Any, Callable[[Any], None]],
                     epoch: ControllerEpoch | None) -> dict[Any, list | Exception]:
        """Several independent multis, pipelined: all sent, then all awaited (`_many` for
        multis). Per key: the results of its `ops`, or the exception that refused it; a multi
        whose request was lost is sent again on its own."""
        pending = [(key, ops, self._start_multi(ops, epoch)) for key, ops in multis.items()]
        out: dict[Any, list | Exception] = {}
        for key, ops, request in pending:
            try:
                results = request.get(timeout=self._timeout)
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
                results = self._wait(lambda ops=ops: self._start_multi(ops, epoch))
            except KazooTimeoutError:
                raise StoreUnavailable(f"ZooKeeper at {self.connect} did not answer within "
                                       f"{int(self._timeout * 1000)} ms") from None
            except ConnectionClosedError:
                raise StoreUnavailable(f"ZooKeeper at {self.connect}: the store is closed") from None
            try:
                out[key] = self._outcome(results, epoch)
            except KazooException as error:
                out[key] = error
        return out

    @staticmethod
    def _outcome(results: list, epoch: ControllerEpoch | None) -> list:
        """A multi's results without the epoch check; raises ControllerMoved or the failing
        operation's error."""
        if epoch is not None:
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                raise ControllerMoved(f"controller epoch {epoch.epoch} (znode version {epoch.version}) is stale")
            results = results[1:]
        # The failing operation carries the real error; the others report a rollback.
        failures = [r for r in results if isinstance(r, KazooException)
                    and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        if failures:
            raise failures[0]
        return results

    def _update_json(self, path: str, change: Callable[[dict | None], dict | None]) -> None:
        """Read-modify-write with a conditional update, retried on conflicts."""
        while True:
            current = self._get(path)
            new = change(json.loads(current[0]) if current and current[0] else None)
            try:
                if current is None:
                    if new is not None:
                        self._call("create", path, to_json(new), makepath=True)
                elif new is None:
                    self._call("delete", path, version=current[1].version)
                else:
                    self._call("set", path, to_json(new), version=current[1].version)
                return
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue

    def _state_changed(self, state: str) -> None:
        # Runs on kazoo's connection thread, which must not block: callbacks get a thread.
        # kazoo reports LOST for its own close too; that is no session loss to react to.
        if state == KazooState.LOST and not self._closing:
            for callback in list(self._session_lost):
                threading.Thread(target=callback, name="zk-session-lost", daemon=True).start()

    # -- lifecycle -------------------------------------------------------------------------
    def on_session_lost(self, callback: Callable[[], None]) -> None:
        self._session_lost.append(callback)

    @property
    def connected(self) -> bool:
        return self._zk.connected

    def close(self) -> None:
        self._closing = True
        try:
            self._zk.stop()
        finally:
            self._zk.close()
