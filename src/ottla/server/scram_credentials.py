"""SCRAM credentials (KIP-554): stored durably, as Kafka stores them even before any SASL
listener uses them, so tools that provision users work against Ottla.

One JSON file in the data directory, rewritten atomically (temp file, fsync, rename, fsync
of the directory) on every change: user -> mechanism -> iterations, salt, salted password.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

from ..durability import fsync

MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's ScramMechanism bounds
FILE_NAME = "scram-credentials.json"


class ScramCredentials:
    def __init__(self, data_dir: Path):
        self._path = Path(data_dir) / FILE_NAME
        self.users: dict[str, dict[int, dict]] = {}
        if self._path.exists():
            raw = json.loads(self._path.read_text(encoding="utf-8"))
            self.users = {user: {int(m): c for m, c in creds.items()} for user, creds in raw.items()}

    def upsert(self, user: str, mechanism: int, iterations: int, salt: bytes, salted_password: bytes) -> None:
        self.users.setdefault(user, {})[mechanism] = {
            "iterations": iterations, "salt": salt.hex(), "salted_password": salted_password.hex()}

    def delete(self, user: str, mechanism: int) -> bool:
        creds = self.users.get(user, {})
        if mechanism not in creds:
            return False
        del creds[mechanism]
        if not creds:
            del self.users[user]
        return True

    def save(self) -> None:
        tmp = self._path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({u: {str(m): c for m, c in creds.items()} for u, creds in self.users.items()}, f)
            f.flush()
            fsync(f.fileno(), tmp)
        os.replace(tmp, self._path)
        fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            fsync(fd, self._path.parent)
        finally:
            os.close(fd)


_stores: "weakref.WeakKeyDictionary[object, ScramCredentials]" = weakref.WeakKeyDictionary()


def for_broker(broker) -> ScramCredentials:
    """The broker's credential store, loaded from its data directory on first use."""
    store = _stores.get(broker)
    if store is None:
        store = _stores[broker] = ScramCredentials(broker.data_dir)
    return store
