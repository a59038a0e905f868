"""A partition's producer state is loaded on its first use after a start: the newest snapshot,
then every batch past it. With that snapshot lost, the load replays the whole segment; the
first request needing the state loads it in steps with the event loop turning between them
(issue 11: no long holds of the loop), and requests arriving meanwhile wait for the same load,
so an idempotent retry is still answered as a duplicate and an open transaction still holds
the last stable offset (issue 13)."""

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.log.manager import LogManager
from ottla.producer_state.manager import RELOAD_STEP_BATCHES
from ottla.records.records import Record, build_batch
from ottla.server.metadata_cache import PartitionState
from ottla.server.replica_manager import ReplicaManager
from tests.loop_turns import seen_between_turns, with_turns

PRODUCERS = 50
TXN_PID = 999
OLD_PID = 500
HOUR_MS = 3_600_000
NOW = int(time.time() * 1000)


def _batch(pid, seq, *, txn=False):
    return build_batch([Record(b"k", b"v", (), NOW + seq)], producer_id=pid, producer_epoch=0,
                       base_sequence=seq, is_transactional=txn)


def _restarted_with_the_snapshot_lost(tmp_path, configs=None, *, old_segment=False):
    """3.5 steps of idempotent batches (50 producers in turn) and a transaction opened in the
    middle, left open; a clean shutdown (its snapshot at the log end), that snapshot deleted,
    a start. With `old_segment`, a segment holding one batch of producer OLD_PID two hours old
    comes first. Returns the replica manager leading t-0, the log, the transaction's first
    offset and each producer's offsets."""
    logs = LogManager(tmp_path, BrokerConfig({}))
    logs.create_topic("t", 1, configs or {})
    log = logs.get_log("t", 0)
    if old_segment:
        log.append(build_batch([Record(b"k", b"old", (), NOW - 2 * HOUR_MS)], producer_id=OLD_PID,
                               producer_epoch=0, base_sequence=0), now_ms=NOW)
        log.roll(NOW)
    offsets = [[] for _ in range(PRODUCERS)]
    txn_first = None
    for i in range(RELOAD_STEP_BATCHES * 7 // 2):
        if i == RELOAD_STEP_BATCHES * 2:
            txn_first = log.append(_batch(TXN_PID, 0, txn=True), now_ms=NOW).base_offset
        pid = i % PRODUCERS
        offsets[pid].append(log.append(_batch(pid, len(offsets[pid])), now_ms=NOW).base_offset)
    logs.close()
    snapshots = list((tmp_path / "t-0").glob("*.snapshot"))
    assert snapshots
    for path in snapshots:
        path.unlink()

    logs = LogManager(tmp_path, BrokerConfig({}))
    replicas = ReplicaManager(1, logs)
    replicas.apply_partition_states([PartitionState("t", 0, 1, 0, (1,), (1,))], now_ms=NOW)
    log = logs.get_log("t", 0)
    assert not log.producer_state_ready  # nothing read yet
    return replicas, log, txn_first, offsets


def _produce(replicas, records):
    return replicas.append_records({("t", 0): records}, acks=1, timeout_ms=30_000, now_ms=NOW)


def test_the_first_produce_after_a_start_loads_producer_state_in_steps(tmp_path):
    replicas, log, txn_first, offsets = _restarted_with_the_snapshot_lost(tmp_path)
    end = log.log_end_offset
    try:
        def loaded_to():  # looked at without finishing a pending load
            state = log._producers.created
            return None if state is None else state.map_end_offset

        # Producer 0 retries its last batch, its first request after the restart.
        last = len(offsets[0]) - 1
        seen, results = asyncio.run(seen_between_turns(_produce(replicas, _batch(0, last)), loaded_to))

        # Other tasks ran between the steps, with the state half-built after each.
        assert len({m for m in seen if m is not None and 0 < m < end}) >= 3
        result = results[("t", 0)]
        assert (result.error, result.base_offset) == (ErrorCode.none, offsets[0][last])  # a duplicate
        assert log.log_end_offset == end
        assert log.last_stable_offset == txn_first
    finally:
        replicas.close()
        replicas.logs.close()


def test_requests_arriving_during_the_load_wait_for_it(tmp_path):
    replicas, log, txn_first, offsets = _restarted_with_the_snapshot_lost(tmp_path)
    end = log.log_end_offset
    try:
        async def scenario():
            # Producer 1's next batch starts the load; producer 0's retry of its last batch and
            # the transaction's next batch arrive while it runs.
            first = asyncio.ensure_future(_produce(replicas, _batch(1, len(offsets[1]))))
            await asyncio.sleep(0)
            assert not log.producer_state_ready  # the load is under way, not done
            retry = asyncio.ensure_future(_produce(replicas, _batch(0, len(offsets[0]) - 1)))
            txn = asyncio.ensure_future(_produce(replicas, _batch(TXN_PID, 1, txn=True)))
            return [(await f)[("t", 0)] for f in (first, retry, txn)]

        turns, (first, retry, txn) = asyncio.run(with_turns(scenario()))

        assert turns >= 3  # one per step of RELOAD_STEP_BATCHES replayed batches
        assert (first.error, first.base_offset) == (ErrorCode.none, end)
        assert (retry.error, retry.base_offset) == (ErrorCode.none, offsets[0][-1])
        assert (txn.error, txn.base_offset) == (ErrorCode.none, end + 1)  # sequence 1 follows its 0
        assert log.log_end_offset == end + 2
        assert log.last_stable_offset == txn_first  # the transaction open before the restart holds it
    finally:
        replicas.close()
        replicas.logs.close()


def test_retention_leaves_a_never_used_partitions_state_to_its_first_use_which_loads_in_steps(tmp_path):
    """Retention deleting the oldest segment of a partition not used since the start does not
    load its producer state (that was the whole replay in one hold of the loop): the first use
    loads it, in steps, from the new log start, and forgets the producers whose batches went."""
    replicas, log, txn_first, offsets = _restarted_with_the_snapshot_lost(
        tmp_path, {"retention.ms": HOUR_MS}, old_segment=True)
    end = log.log_end_offset
    try:
        assert log.apply_retention(NOW) == 1
        assert log.log_start_offset == 1
        assert not log.producer_state_ready  # nothing loaded by the deletion

        def loaded_to():
            state = log._producers.created
            return None if state is None else state.map_end_offset

        last = len(offsets[0]) - 1
        seen, results = asyncio.run(seen_between_turns(_produce(replicas, _batch(0, last)), loaded_to))

        assert len({m for m in seen if m is not None and 1 < m < end}) >= 3
        result = results[("t", 0)]
        assert (result.error, result.base_offset) == (ErrorCode.none, offsets[0][last])  # a duplicate
        assert log.last_stable_offset == txn_first
        assert log.producer_state.entry(OLD_PID) is None  # its only batch was deleted
    finally:
        replicas.close()
        replicas.logs.close()


def _in_steps_as_first_use(tmp_path, first_use, configs=None, *, old_segment=False):
    """Restart a broker over the log of `_restarted_with_the_snapshot_lost` and await
    `first_use(broker)`, the partition's first use: the load must run in steps (at least three
    partial loads seen between turns of the loop). Returns its result and the open
    transaction's first offset."""
    from ottla.server.broker import Broker

    replicas, _, txn_first, _ = _restarted_with_the_snapshot_lost(tmp_path, configs, old_segment=old_segment)
    replicas.close()
    replicas.logs.close()
    broker = Broker(tmp_path, BrokerConfig({}), host="127.0.0.1", port=0)
    log = broker.logs.get_log("t", 0)
    assert not log.producer_state_ready

    def loaded_to():
        state = log._producers.created
        return None if state is None else state.map_end_offset

    try:
        seen, result = asyncio.run(seen_between_turns(first_use(broker), loaded_to))
        assert len({m for m in seen if m is not None and log.log_start_offset < m < log.log_end_offset}) >= 3
        return result, txn_first
    finally:
        broker.replicas.close()
        broker.logs.close()
        broker.release_data_dir()


def _handled_in_steps_as_first_use(tmp_path, handler, request, api_version: int, response_type, configs=None,
                                   *, old_segment=False):
    """`_in_steps_as_first_use` with `request` handled as the first use; returns the answer."""
    def handled(broker):
        return handler(SimpleNamespace(broker=broker, api_version=api_version, response_type=response_type),
                       request)
    return _in_steps_as_first_use(tmp_path, handled, configs, old_segment=old_segment)


def test_a_read_committed_fetch_as_first_use_loads_in_steps_and_sees_the_open_transaction(tmp_path):
    from kio.schema.fetch.v11 import request as fetch11
    from kio.schema.fetch.v11.response import FetchResponse
    from kio.serial import entity_reader

    from ottla.protocol.codec import EncodedBody
    from ottla.server.handlers import fetch

    request = fetch11.FetchRequest(
        replica_id=-1, max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20, isolation_level=1, session_id=0,
        session_epoch=-1, forgotten_topics_data=(), rack_id="",
        topics=(fetch11.FetchTopic(topic="t", partitions=(fetch11.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=1 << 20),)),))
    response, txn_first = _handled_in_steps_as_first_use(tmp_path, fetch.handle, request, 11, FetchResponse)
    if isinstance(response, EncodedBody):  # an answer encoded ahead (`fetch._encoded_if_empty`)
        response = entity_reader(FetchResponse)(bytes(response), 0)[0]
    answer = response.responses[0].partitions[0]
    assert (answer.error_code, answer.last_stable_offset) == (ErrorCode.none, txn_first)


def test_a_read_committed_list_offsets_by_time_as_first_use_loads_in_steps(tmp_path):
    """A lookup by time answers only below the LSO read_committed, which needs the state: loaded
    in steps, as for latest. The newest record (the max timestamp) is past the open transaction's
    first offset, so there is nothing to answer yet."""
    from kio.schema.list_offsets.v7 import request as list_offsets7
    from kio.schema.list_offsets.v7.response import ListOffsetsResponse

    from ottla.server.handlers import list_offsets

    request = list_offsets7.ListOffsetsRequest(
        replica_id=-1, isolation_level=1, topics=(list_offsets7.ListOffsetsTopic(name="t", partitions=(
            list_offsets7.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                               timestamp=list_offsets.MAX_TIMESTAMP),)),))
    response, _ = _handled_in_steps_as_first_use(tmp_path, list_offsets.handle, request, 7, ListOffsetsResponse)
    answer = response.topics[0].partitions[0]
    assert (answer.error_code, answer.offset) == (ErrorCode.none, -1)


COMPACTED = {"cleanup.policy": "compact"}


def test_the_cleaners_dirty_ratio_check_as_first_use_loads_in_steps_then_cleans_below_the_lso(tmp_path):
    """The check reads the LSO, which needs the state: the cleaner skips the log and has it
    loaded in steps, a task of its own, and cleans it in a later round."""
    async def two_rounds(broker):
        log = broker.logs.get_log("t", 0)
        first = broker.cleaner.clean_once(lambda f: f())
        while not log.producer_state_ready:  # the cleaner's load goes on without anyone awaiting it
            await asyncio.sleep(0)
        return first, broker.cleaner.clean_once(lambda f: f())

    (first, second), _ = _in_steps_as_first_use(tmp_path, two_rounds, COMPACTED, old_segment=True)
    assert first is None
    assert second.end_offset == 1  # the old segment: the active one, with the open transaction, stays dirty


def test_a_dirty_ratio_asked_of_describe_log_dirs_as_first_use_loads_in_steps(tmp_path):
    from ottla.protocol.extensions import DESCRIBE_LOG_DIRS, extended_request, extended_response
    from ottla.protocol.build import make, nested
    from ottla.server.handlers import describe_log_dirs

    request_type, response_type = extended_request(DESCRIBE_LOG_DIRS, 4), extended_response(DESCRIBE_LOG_DIRS, 4)
    request = make(request_type, topics=(make(nested(request_type, "DescribableLogDirTopic"), topic="t",
                                              partitions=(0,)),), dirty_ratio=True)
    response, _ = _handled_in_steps_as_first_use(tmp_path, describe_log_dirs.handle, request, 4, response_type,
                                                 COMPACTED, old_segment=True)
    answer = response.results[0].topics[0].partitions[0]
    assert answer.dirty_ratio == 1.0  # the old segment is dirty; the active one is not cleanable
