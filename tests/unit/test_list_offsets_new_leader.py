"""ListOffsets on a new leader whose high watermark is still below the start offset of its
leader epoch (KIP-207): answering its HW as latest would go back from what the previous
leader answered, so clients get a retriable error until the HW reaches the epoch start.
Driven on a real replica manager and logs; on real brokers in test_leader_epochs.py."""

import asyncio
import importlib
import time
from types import SimpleNamespace

import pytest

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode as E
from ottla.log.manager import LogManager
from ottla.records.records import Record, build_batch
from ottla.protocol.legacy.list_offsets.v0 import response as legacy_v0
from ottla.server.handlers import list_offsets
from ottla.server.metadata_cache import PartitionState
from ottla.server.replica_manager import ReplicaManager

NOW = int(time.time() * 1000)
T0 = 1_700_000_000_000  # the records' timestamps: T0, T0 + 1, T0 + 2
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


@pytest.fixture
def manager(tmp_path):
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("t", 1, {})
    yield ReplicaManager(1, logs)
    logs.close()


def _ask(manager, version: int, timestamp: int, replica_id: int = -1) -> tuple[int, int]:
    """(error code, offset) of ListOffsets `version` (read_uncommitted) for t-0."""
    response_type = (legacy_v0.ListOffsetsResponse if version == 0
                     else importlib.import_module(f"kio.schema.list_offsets.v{version}.response").ListOffsetsResponse)
    request = SimpleNamespace(replica_id=replica_id, isolation_level=0, topics=(SimpleNamespace(name="t", partitions=(
        SimpleNamespace(partition_index=0, timestamp=timestamp, current_leader_epoch=-1, max_num_offsets=1),)),))
    ctx = SimpleNamespace(broker=SimpleNamespace(replicas=manager, logs=manager.logs), api_version=version,
                          response_type=response_type)
    answer = asyncio.run(list_offsets.handle(ctx, request)).topics[0].partitions[0]
    if version == 0:
        return answer.error_code, (answer.old_style_offsets or (-1,))[0]
    return answer.error_code, answer.offset


def _new_leader_with_hw_behind(manager):
    """Epoch 0: three records, follower 2 has fetched two (HW 2). Epoch 1 starts at offset 3."""
    manager.apply_partition_states([PartitionState("t", 0, 1, 0, (1, 2), (1, 2))], now_ms=NOW)
    manager.append("t", 0, build_batch([Record(b"k", b"v%d" % i, timestamp=T0 + i) for i in range(3)]), now_ms=NOW)
    manager.follower_fetched("t", 0, 2, 2, NOW)
    manager.apply_partition_states([PartitionState("t", 0, 1, 1, (1, 2), (1, 2))], now_ms=NOW)
    partition = manager.get_partition("t", 0)
    assert (partition.leader_epoch, partition.high_watermark, partition.log_end_offset) == (1, 2, 3)
    return partition


def test_latest_is_not_available_until_the_hw_reaches_the_epoch_start(manager):
    partition = _new_leader_with_hw_behind(manager)
    for version in (5, 7, 11):
        assert _ask(manager, version, LATEST) == (E.offset_not_available, -1)
        assert _ask(manager, version, EARLIEST) == (E.none, 0)
        assert _ask(manager, version, T0 + 1) == (E.none, 1)  # below the HW: answered
        assert _ask(manager, version, T0 + 2) == (E.offset_not_available, -1)  # at the HW
        assert _ask(manager, version, T0 + 9) == (E.offset_not_available, -1)  # none that late, yet
    assert _ask(manager, 7, MAX_TIMESTAMP) == (E.offset_not_available, -1)  # offset 2, not below the HW
    for version in (1, 2, 4):  # before OFFSET_NOT_AVAILABLE (v5), Kafka answers LEADER_NOT_AVAILABLE
        assert _ask(manager, version, LATEST) == (E.leader_not_available, -1)
    assert _ask(manager, 0, LATEST) == (E.none, 2)  # v0: Kafka's legacy path has no such check
    assert _ask(manager, 11, LATEST, replica_id=2) == (E.none, 3)  # a follower: the log end
    assert _ask(manager, 11, LATEST, replica_id=-2) == (E.none, 2)  # Kafka's debugging replica id

    manager.follower_fetched("t", 0, 2, 3, NOW + 1)
    assert partition.high_watermark == 3
    assert _ask(manager, 11, LATEST) == (E.none, 3)
    assert _ask(manager, 11, T0 + 2) == (E.none, 2)
    assert _ask(manager, 11, T0 + 9) == (E.none, -1)
    assert _ask(manager, 1, LATEST) == (E.none, 3)


def test_a_leader_alone_in_the_isr_answers_at_once(manager):
    manager.apply_partition_states([PartitionState("t", 0, 1, 0, (1,), (1,))], now_ms=NOW)
    manager.append("t", 0, build_batch([Record(b"k", b"v")]), now_ms=NOW)
    manager.apply_partition_states([PartitionState("t", 0, 1, 1, (1, 2), (1,))], now_ms=NOW)
    assert _ask(manager, 11, LATEST) == (E.none, 1)
