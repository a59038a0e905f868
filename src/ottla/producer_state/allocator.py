"""Producer ids: unique across the cluster and across restarts, handed out from claimed blocks.

A broker claims a block of ids (Kafka: 1000) in shared durable storage and hands them out
from memory. The claim is durable before the first id of the block leaves the broker, so a
crash can only waste the rest of a block, never hand an id out twice. Kafka kept the latest
claim in ZooKeeper (`/latest_producer_id_block`, written with a conditional update); the
store interface leaves room for that, `FileProducerIdBlockStore` serves a single host.
"""

from __future__ import annotations

import fcntl
import json
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import NamedTuple

from ._files import atomic_write

BLOCK_SIZE = 1000
STORE_FILE_NAME = "latest_producer_id_block"  # in the broker's data dir, after the ZooKeeper path
MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdBlock(NamedTuple):
    broker_id: int
    first: int
    size: int

    @property
    def last(self) -> int:
        return self.first + self.size - 1


class ProducerIdsExhaustedError(RuntimeError):
    """The next block would pass Int64 max: no producer id can be handed out any more."""


class ProducerIdBlockStore(ABC):
    """Where brokers claim blocks; every claim must be durable and disjoint from all others."""

    @abstractmethod
    def claim_next_block(self, broker_id: int) -> ProducerIdBlock:
        """Durably record and return the block after the latest one claimed by anyone."""


class FileProducerIdBlockStore(ProducerIdBlockStore):
    """The latest claimed block in a JSON file shaped like Kafka's ZooKeeper node.

    `{"version": 1, "broker": 0, "block_start": "4000", "block_end": "4999"}`. An exclusive
    lock on a sibling `.lock` file makes read-modify-write safe between processes, standing
    in for ZooKeeper's conditional update. A file that cannot be read is an error, never a
    reason to start again from 0.
    """

    def __init__(self, path: Path, *, block_size: int = BLOCK_SIZE):
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.path = Path(path)
        self.block_size = block_size
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def latest_block(self) -> ProducerIdBlock | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        if data.get("version") != 1:
            raise ValueError(f"{self.path}: unknown producer id block version {data.get('version')!r}")
        first, last = int(data["block_start"]), int(data["block_end"])
        return ProducerIdBlock(int(data["broker"]), first, last - first + 1)

    def claim_next_block(self, broker_id: int) -> ProducerIdBlock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as lock_file:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
            latest = self.latest_block()
            first = 0 if latest is None else latest.last + 1
            if first > MAX_PRODUCER_ID - self.block_size + 1:
                raise ProducerIdsExhaustedError(f"no block of {self.block_size} ids left after {first - 1}")
            block = ProducerIdBlock(broker_id, first, self.block_size)
            record = {"version": 1, "broker": broker_id, "block_start": str(block.first), "block_end": str(block.last)}
            atomic_write(self.path, json.dumps(record).encode())
            return block


class ProducerIdManager:
    """Hands out producer ids for InitProducerId, claiming a new block when one runs out.

    Claiming fsyncs, so it blocks for a moment once per block; callers on an event loop
    may run `generate_producer_id` in a thread, which the lock makes safe.
    """

    def __init__(self, store: ProducerIdBlockStore, broker_id: int):
        self.store = store
        self.broker_id = broker_id
        self._lock = threading.Lock()
        self._block: ProducerIdBlock | None = None
        self._next = 0

    def generate_producer_id(self) -> int:
        with self._lock:
            if self._block is None or self._next > self._block.last:
                self._block = self.store.claim_next_block(self.broker_id)
                self._next = self._block.first
            producer_id = self._next
            self._next += 1
            return producer_id
