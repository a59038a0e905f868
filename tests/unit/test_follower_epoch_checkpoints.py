"""A follower's first fetched batches of its leaders' new epochs (a broker restarted after its
leaders changed): each makes the append write that partition's leader epoch checkpoint, two
fsyncs. On the event loop, hundreds of them held every request of the broker for seconds (7.8 s
for 500 partitions in one fetch response at load 17), which was most of the restarted broker's
way back into the ISR. The fetcher now writes them in worker threads first. In process, real
logs; os.fsync is observed, not replaced."""

from __future__ import annotations

import asyncio
import os
import threading

from kio.schema.fetch.v12 import response as fetch_response

from ottla.config import BrokerConfig
from ottla.errors import ErrorCode
from ottla.log import LogManager
from ottla.log.leader_epoch import read_checkpoint
from ottla.records.records import Record, build_batch
from ottla.replication.follower import FetchPhase, FollowerFetchState
from ottla.server.broker import Broker
from ottla.server.clock import now_ms
from ottla.server.interbroker import InterBrokerClient
from ottla.server.metadata_cache import PartitionState
from ottla.server.replica_fetcher import ReplicaFetcherManager, _Fetcher

PARTITIONS = 8
NEW_EPOCH = 3


def test_a_fetch_bringing_new_leader_epochs_writes_their_checkpoints_off_the_event_loop(tmp_path, monkeypatch):
    leader = LogManager(tmp_path / "leader", BrokerConfig({}))
    leader.create_topic("t", PARTITIONS, {})
    for p in range(PARTITIONS):  # the leader's new epoch: its batches are stamped with it
        leader.get_log("t", p).append(build_batch([Record(b"k", b"v")] * 3), now_ms=now_ms(),
                                            leader_epoch=NEW_EPOCH)
    loop_fsyncs: list[str] = []

    async def scenario():
        broker = Broker(tmp_path / "follower", BrokerConfig({}))
        try:
            broker.create_topic("t", PARTITIONS, {})  # led here at epoch 0 first
            broker.replicas.apply_partition_states(
                [PartitionState("t", p, 2, NEW_EPOCH, (1, 2), (2,)) for p in range(PARTITIONS)])
            fetcher = _Fetcher(ReplicaFetcherManager(broker, InterBrokerClient("test")), 2)
            fetcher.stop()  # its requests are what this test plays by hand
            await asyncio.gather(fetcher.task, return_exceptions=True)
            usable = []
            for p in range(PARTITIONS):
                state = FollowerFetchState(broker.logs.get_log("t", p), 2, NEW_EPOCH)
                state.phase = FetchPhase.FETCHING  # both logs are empty: nothing to truncate
                fetcher.states[("t", p)] = state
                served = leader.get_log("t", p).read(0, 1 << 20, max_offset=3)
                usable.append((("t", p), state, fetch_response.PartitionData(
                    partition_index=p, error_code=ErrorCode.none, high_watermark=3, log_start_offset=0,
                    aborted_transactions=(), records=bytes(served.records))))
            loop_thread = threading.get_ident()
            real_fsync = os.fsync

            def fsync(fd):
                if threading.get_ident() == loop_thread:
                    loop_fsyncs.append(os.readlink(f"/proc/self/fd/{fd}"))
                return real_fsync(fd)
            monkeypatch.setattr(os, "fsync", fsync)
            written = await fetcher._write_epoch_starts_ahead(usable)
            for key, state, data in usable:
                fetcher._apply(key, state, data)
            monkeypatch.undo()
            assert len(written) == PARTITIONS
            for p in range(PARTITIONS):
                log = broker.logs.get_log("t", p)
                assert log.log_end_offset == 3
                assert read_checkpoint(log.leader_epoch_cache.path) == log.leader_epoch_cache.entries == [(NEW_EPOCH, 0)]
        finally:
            monkeypatch.undo()
            broker.replicas.close()
            broker.logs.close()
            broker.release_data_dir()

    try:
        asyncio.run(scenario())
    finally:
        leader.close()
    assert [path for path in loop_fsyncs if "t-" in path] == []
