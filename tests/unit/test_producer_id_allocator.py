"""Producer id blocks: durable claims, no id handed out twice across restarts and kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ottla.errors import ErrorCode, KafkaError
from ottla.producer_state import (
    FileProducerIdBlockStore,
    ProducerIdBlock,
    ProducerIdBlockStore,
    ProducerIdManager,
    ProducerIdsExhaustedError,
)
from ottla.producer_state.allocator import MAX_PRODUCER_ID
from ottla.producer_state.authorizer import (
    CLUSTER,
    AllowAllAuthorizer,
    Operation,
    require_idempotent_write,
)


def test_blocks_follow_each_other_from_zero(tmp_path):
    store = FileProducerIdBlockStore(tmp_path / "latest_producer_id_block")
    assert store.latest_block() is None
    assert store.claim_next_block(3) == ProducerIdBlock(3, 0, 1000)
    assert store.claim_next_block(4) == ProducerIdBlock(4, 1000, 1000)
    assert json.loads(store.path.read_text()) == {
        "version": 1,
        "broker": 4,
        "block_start": "1000",
        "block_end": "1999",
    }


def test_manager_hands_out_a_block_then_claims_the_next(tmp_path):
    store = FileProducerIdBlockStore(tmp_path / "pids", block_size=3)
    manager = ProducerIdManager(store, broker_id=1)
    assert [manager.generate_producer_id() for _ in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert store.latest_block() == ProducerIdBlock(1, 6, 3)


def test_block_is_claimed_before_its_first_id_is_handed_out(tmp_path):
    calls = []

    class RecordingStore(ProducerIdBlockStore):
        def __init__(self):
            self.inner = FileProducerIdBlockStore(tmp_path / "pids", block_size=2)

        def claim_next_block(self, broker_id):
            block = self.inner.claim_next_block(broker_id)
            calls.append(("claimed", block.first, self.inner.latest_block()))
            return block

    manager = ProducerIdManager(RecordingStore(), broker_id=0)
    ids = [manager.generate_producer_id() for _ in range(3)]
    assert ids == [0, 1, 2]
    assert calls == [("claimed", 0, ProducerIdBlock(0, 0, 2)), ("claimed", 2, ProducerIdBlock(0, 2, 2))]


def test_restart_skips_the_rest_of_the_block(tmp_path):
    path = tmp_path / "pids"
    first = ProducerIdManager(FileProducerIdBlockStore(path), broker_id=0)
    assert first.generate_producer_id() == 0
    second = ProducerIdManager(FileProducerIdBlockStore(path), broker_id=0)
    assert second.generate_producer_id() == 1000


def test_unreadable_store_is_an_error_not_a_fresh_start(tmp_path):
    path = tmp_path / "pids"
    path.write_text('{"version": 1, "broker": 0, "block_st')
    with pytest.raises(ValueError):
        FileProducerIdBlockStore(path).claim_next_block(0)
    path.write_text('{"version": 7, "broker": 0, "block_start": "0", "block_end": "999"}')
    with pytest.raises(ValueError):
        FileProducerIdBlockStore(path).claim_next_block(0)


def test_exhausted_id_space(tmp_path):
    path = tmp_path / "pids"
    last = MAX_PRODUCER_ID - 500
    path.write_text(json.dumps({"version": 1, "broker": 0, "block_start": str(last - 999), "block_end": str(last)}))
    with pytest.raises(ProducerIdsExhaustedError):
        FileProducerIdBlockStore(path).claim_next_block(0)
    exact = FileProducerIdBlockStore(path, block_size=500)
    assert exact.claim_next_block(0).last == MAX_PRODUCER_ID


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ottla.producer_state import FileProducerIdBlockStore, ProducerIdManager

    path, block_size, mode, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

    class AnnouncingStore(FileProducerIdBlockStore):
        def claim_next_block(self, broker_id):
            block = super().claim_next_block(broker_id)
            print(f"claimed {block.first} {block.last}", flush=True)
            if mode == "hang-after-claim":
                time.sleep(600)  # killed here: the block is claimed, none of its ids handed out
            return block

    manager = ProducerIdManager(AnnouncingStore(Path(path), block_size=block_size), broker_id=0)
    for _ in range(count):
        print(f"id {manager.generate_producer_id()}", flush=True)
    if mode == "kill-after":
        time.sleep(600)
    """
)


def _run_child(path, block_size, mode, count, kill_after_lines=None):
    """Run one broker "life"; SIGKILL it after reading `kill_after_lines` lines if given."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(block_size), mode, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = []
    if kill_after_lines is None:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        return out.splitlines()
    for _ in range(kill_after_lines):
        lines.append(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)  # anything it printed before dying was handed out
    assert proc.returncode == -signal.SIGKILL
    return lines + rest.splitlines()


def test_ids_stay_unique_across_ten_restarts_with_kill_minus_nine(tmp_path):
    path = tmp_path / "latest_producer_id_block"
    block_size = 5
    lives = [
        ("clean", 3, None),
        ("kill-after", 7, 7 + 2),  # killed right after handing out 7 ids (2 claims), mid-block
        ("hang-after-claim", 10, 1),  # killed right after a claim, before any id of it left
        ("clean", 12, None),
        ("stream", 10**6, 23),  # killed at whatever point it has reached while handing out ids
        ("hang-after-claim", 10, 1),
        ("kill-after", 5, 5 + 1),  # killed with its block exactly used up
        ("clean", 0, None),  # started and stopped without handing out anything
        ("kill-after", 11, 11 + 3),
        ("stream", 10**6, 40),
    ]
    handed_out = []
    claimed = []
    for mode, count, kill_after in lives:
        lines = _run_child(path, block_size, mode, count, kill_after)
        life_ids = [int(line.split()[1]) for line in lines if line.startswith("id ")]
        life_claims = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("claimed ")]
        if mode == "hang-after-claim":
            assert life_ids == [] and len(life_claims) == 1
        elif mode == "stream":
            assert kill_after - len(life_claims) <= len(life_ids) < count
        else:
            assert len(life_ids) == count
        assert life_ids == sorted(life_ids)
        for first, last in life_claims:
            # every block starts after everything claimed before, in this life or an earlier one
            assert all(first > earlier_last for _, earlier_last in claimed)
            claimed.append((first, last))
        handed_out.extend(life_ids)

    assert len(handed_out) == len(set(handed_out))
    assert all(any(first <= pid <= last for first, last in claimed) for pid in handed_out)


def test_concurrent_brokers_claim_disjoint_blocks(tmp_path):
    path = tmp_path / "latest_producer_id_block"
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from ottla.producer_state import FileProducerIdBlockStore
        store = FileProducerIdBlockStore(Path(sys.argv[1]), block_size=10)
        for _ in range(40):
            print(store.claim_next_block(int(sys.argv[2])).first, flush=True)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(path), str(b)], stdout=subprocess.PIPE, text=True)
        for b in range(4)
    ]
    firsts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        firsts.extend(int(x) for x in out.split())
    assert sorted(firsts) == list(range(0, 160 * 10, 10))


def test_allow_all_authorizer_allows_idempotent_write():
    authorizer = AllowAllAuthorizer()
    assert authorizer.authorize("User:alice", Operation.IDEMPOTENT_WRITE, CLUSTER)
    require_idempotent_write(authorizer, "User:alice")


def test_denied_idempotent_write_is_a_cluster_authorization_failure():
    class DenyAll:
        def authorize(self, principal, operation, resource):
            return False

    with pytest.raises(KafkaError) as info:
        require_idempotent_write(DenyAll(), "User:mallory")
    assert info.value.code == ErrorCode.cluster_authorization_failed
