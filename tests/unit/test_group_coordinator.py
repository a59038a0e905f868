"""The classic group coordinator driven with explicit time and an in-memory offsets log."""

from __future__ import annotations

import struct
from collections import defaultdict

from ottla.config import BrokerConfig
from ottla.coordinator.group import (
    GroupCoordinator,
    LeavingMember,
    OffsetCommit,
    StoredRecord,
    StoredTxnMarker,
)
from ottla.coordinator.group.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    encode_key,
)
from ottla.errors import ErrorCode

E = ErrorCode
SESSION = 10_000
REBALANCE = 30_000


class MemoryStore:
    """A __consumer_offsets stand-in: appends become durable when the test says so (or at once)."""

    def __init__(self, auto: bool = True):
        self.auto = auto
        self.log: dict[int, list] = defaultdict(list)
        self.waiting: list = []

    def append(self, partition, records, on_durable, *, producer_id=-1, producer_epoch=-1):
        self.waiting.append((partition, list(records), on_durable, producer_id))
        if self.auto:
            self.complete()

    def complete(self, error=ErrorCode.none):
        while self.waiting:
            partition, records, on_durable, producer_id = self.waiting.pop(0)
            if error != ErrorCode.none:
                on_durable(error, -1)
                continue
            base = len(self.log[partition])
            for i, (key, value) in enumerate(records):
                self.log[partition].append(StoredRecord(base + i, key, value, producer_id))
            on_durable(ErrorCode.none, base)

    def marker(self, partition, producer_id, commit):
        self.log[partition].append(StoredTxnMarker(len(self.log[partition]), producer_id, commit))

    def load(self, partition):
        return list(self.log[partition])

    def records(self, partition):
        return [(decode_key(r.key), r.value) for r in self.log[partition] if isinstance(r, StoredRecord)]


class Box:
    """Collects what a callback was called with; the coordinator must call it exactly once."""

    def __init__(self):
        self.calls = []

    def __call__(self, result):
        self.calls.append(result)

    @property
    def done(self):
        return bool(self.calls)

    @property
    def value(self):
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


def subscription(*topics):
    """A ConsumerProtocolSubscription v0: topics and null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


RANGE = [("range", subscription("t"))]


def make(store=None, **config):
    settings = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 4}
    settings.update(config)
    coordinator = GroupCoordinator(BrokerConfig(settings), store if store is not None else MemoryStore())
    for partition in range(coordinator.num_partitions):
        coordinator.load_partition(partition, now_ms=0)
    return coordinator


def join(c, now, group="g", member_id="", protocols=RANGE, instance=None, session=SESSION,
         rebalance=REBALANCE, require_known=True, skip=True, protocol_type="consumer", client="client"):
    box = Box()
    c.join_group(group_id=group, member_id=member_id, group_instance_id=instance, protocol_type=protocol_type,
                 protocols=protocols, session_timeout_ms=session, rebalance_timeout_ms=rebalance,
                 client_id=client, client_host="/127.0.0.1", require_known_member_id=require_known,
                 supports_skip_assignment=skip, now_ms=now, on_complete=box)
    return box


def join_with_id(c, now, **kwargs):
    """The KIP-394 dance: first join gets MEMBER_ID_REQUIRED and an id, the second joins for real."""
    first = join(c, now, **kwargs)
    assert first.value.error == E.member_id_required
    return join(c, now, member_id=first.value.member_id, **kwargs)


def sync(c, now, member_id, generation, group="g", assignments=None, instance=None):
    box = Box()
    c.sync_group(group_id=group, generation_id=generation, member_id=member_id, group_instance_id=instance,
                 protocol_type="consumer", protocol_name="range", assignments=assignments or {},
                 now_ms=now, on_complete=box)
    return box


def heartbeat(c, now, member_id, generation, group="g", instance=None):
    return c.heartbeat(group_id=group, member_id=member_id, group_instance_id=instance,
                       generation_id=generation, now_ms=now)


def commit(c, now, offsets, group="g", member_id="", generation=-1, instance=None, retention=-1):
    box = Box()
    c.commit_offsets(group_id=group, member_id=member_id, group_instance_id=instance, generation_id=generation,
                     offsets={tp: OffsetCommit(o) for tp, o in offsets.items()}, now_ms=now,
                     on_complete=box, retention_ms=retention)
    return box


def fetched(c, group="g", partitions=None, require_stable=False):
    result = c.fetch_offsets(group_id=group, partitions=partitions, require_stable=require_stable)
    assert result.error == E.none
    return {tp: (o.offset if o.error == E.none else o.error) for tp, o in result.offsets.items()}


def state(c, group="g"):
    return c.describe_group(group).state


def form_group(c, n, now=0, group="g", **kwargs):
    """n dynamic members join and sync; returns (member ids, generation, leader id)."""
    boxes = [join_with_id(c, now, group=group, **kwargs) for _ in range(n)]
    c.poll(now)
    results = [b.value for b in boxes]
    assert all(r.error == E.none for r in results)
    generation = results[0].generation_id
    leader = results[0].leader
    ids = [r.member_id for r in results]
    assignments = {m: f"assignment-{m}".encode() for m in ids}
    syncs = [sync(c, now, m, generation, group=group, assignments=assignments if m == leader else None)
             for m in ids]
    assert all(s.value.error == E.none for s in syncs)
    assert state(c, group) == "Stable"
    return ids, generation, leader


# --- forming a group ---------------------------------------------------------------------


def test_three_members_share_six_partitions():
    store = MemoryStore()
    c = make(store, **{"group.initial.rebalance.delay.ms": 3000})
    first = join_with_id(c, 0)
    second = join_with_id(c, 1000)
    assert state(c) == "PreparingRebalance"
    c.poll(3000)  # a member arrived during the initial delay: wait one more delay
    assert not first.done
    third = join_with_id(c, 4000)
    c.poll(6000)
    assert not first.done
    c.poll(9000)  # no newcomer in the last delay: the rebalance completes
    results = [first.value, second.value, third.value]
    assert {r.error for r in results} == {E.none}
    assert {r.generation_id for r in results} == {1}
    leader = results[0].leader
    assert leader == results[0].member_id  # the first to join leads
    assert [len(r.members) for r in results] == [3, 0, 0]
    assert {m.member_id for m in results[0].members} == {r.member_id for r in results}
    assert all(m.metadata == RANGE[0][1] for m in results[0].members)
    assert {r.protocol_name for r in results} == {"range"}
    assert state(c) == "CompletingRebalance"

    partitions = [("t", p) for p in range(6)]
    ids = [r.member_id for r in results]
    plan = {m: repr(partitions[i::3]).encode() for i, m in enumerate(ids)}
    follower = sync(c, 9000, ids[1], 1)
    assert not follower.done  # waits for the leader's assignment
    leader_sync = sync(c, 9000, ids[0], 1, assignments=plan)
    last = sync(c, 9000, ids[2], 1)
    got = [leader_sync.value.assignment, follower.value.assignment, last.value.assignment]
    assert got == [plan[m] for m in ids]
    owned = [tp for m in ids for tp in eval(plan[m].decode())]
    assert sorted(owned) == partitions  # every partition once, none twice
    assert state(c) == "Stable"
    stored = [v for k, v in store.records(c.partition_for("g")) if isinstance(k, GroupMetadataKey)]
    value = decode_group_metadata_value(stored[-1])
    assert value.generation == 1 and value.protocol == "range" and value.leader == leader
    assert {m.member_id: m.assignment for m in value.members} == plan


def test_followers_wait_for_the_assignment_to_be_durable():
    store = MemoryStore(auto=False)
    c = make(store)
    boxes = [join_with_id(c, 0) for _ in range(2)]
    c.poll(0)
    leader, follower = boxes[0].value.member_id, boxes[1].value.member_id
    f = sync(c, 0, follower, 1)
    lead = sync(c, 0, leader, 1, assignments={leader: b"A", follower: b"B"})
    assert not f.done and not lead.done and state(c) == "CompletingRebalance"
    store.complete()
    assert (lead.value.assignment, f.value.assignment) == (b"A", b"B")
    assert state(c) == "Stable"


def test_protocol_is_chosen_by_votes_among_common_protocols():
    c = make()
    a = join_with_id(c, 0, protocols=[("range", b"a"), ("roundrobin", b"a"), ("sticky", b"a")])
    b = join_with_id(c, 0, protocols=[("roundrobin", b"b"), ("range", b"b")])
    d = join_with_id(c, 0, protocols=[("range", b"d"), ("roundrobin", b"d")])
    c.poll(0)
    assert {x.value.protocol_name for x in (a, b, d)} == {"range"}  # range 2 votes, roundrobin 1
    assert [m.metadata for m in a.value.members] == [b"a", b"b", b"d"]


def test_member_without_a_common_protocol_is_rejected():
    c = make()
    join_with_id(c, 0, protocols=[("range", b"")])
    odd = join(c, 0, protocols=[("custom", b"")])
    assert odd.value.error == E.inconsistent_group_protocol
    other_type = join(c, 0, protocol_type="connect")
    assert other_type.value.error == E.inconsistent_group_protocol
    c.poll(0)
    assert c.describe_group("g").members and len(c.describe_group("g").members) == 1


def test_member_id_required_and_pending_member_expiry():
    c = make()
    ids, gen, leader = form_group(c, 1)
    pending = join(c, 0)
    assert pending.value.error == E.member_id_required and pending.value.member_id.startswith("client-")
    assert state(c) == "Stable"  # a pending member does not start a rebalance by itself
    # ...but holds one back until it joins or its session expires.
    rejoin = join(c, 0, member_id=leader)
    c.poll(SESSION - 1)
    assert not rejoin.done
    c.poll(SESSION)
    assert rejoin.value.error == E.none and len(rejoin.value.members) == 1
    assert join(c, SESSION, member_id=pending.value.member_id).value.error == E.unknown_member_id


def test_old_clients_join_without_member_id_required():
    c = make()
    box = join(c, 0, require_known=False)
    c.poll(0)
    assert box.value.error == E.none and box.value.member_id.startswith("client-")


# --- rebalances ---------------------------------------------------------------------------


def test_new_member_triggers_rebalance_that_completes_when_all_rejoin():
    c = make()
    ids, gen, leader = form_group(c, 2)
    newcomer = join_with_id(c, 100)
    assert state(c) == "PreparingRebalance"
    assert heartbeat(c, 200, ids[1], gen) == E.rebalance_in_progress
    old = [join(c, 300, member_id=m) for m in ids]
    # Everyone has rejoined: no need to wait for the rebalance timeout.
    assert all(b.value.generation_id == gen + 1 for b in old + [newcomer])
    assert old[0].value.leader == leader and len(old[0].value.members) == 3


def test_leave_triggers_rebalance():
    c = make()
    ids, gen, _ = form_group(c, 3)
    result = c.leave_group(group_id="g", members=[LeavingMember(ids[2])], now_ms=10)
    assert result.error == E.none and result.member_errors == [E.none]
    assert state(c) == "PreparingRebalance"
    boxes = [join(c, 20, member_id=m) for m in ids[:2]]
    assert [b.value.generation_id for b in boxes] == [gen + 1] * 2
    assert {m.member_id for m in boxes[0].value.members} == set(ids[:2])


def test_last_member_leaving_empties_the_group_and_keeps_offsets():
    store = MemoryStore()
    c = make(store)
    ids, gen, _ = form_group(c, 1)
    assert commit(c, 5, {("t", 0): 42}, member_id=ids[0], generation=gen).value == {("t", 0): E.none}
    c.leave_group(group_id="g", members=[LeavingMember(ids[0])], now_ms=10)
    assert state(c) == "Empty"
    assert fetched(c) == {("t", 0): 42}
    stored = [decode_group_metadata_value(v) for k, v in store.records(c.partition_for("g"))
              if isinstance(k, GroupMetadataKey)]
    assert stored[-1].members == () and stored[-1].generation == gen + 1
    assert stored[-1].current_state_timestamp == 10


def test_session_timeout_expires_a_silent_member():
    c = make()
    ids, gen, _ = form_group(c, 2)
    for t in range(3000, SESSION, 3000):
        assert heartbeat(c, t, ids[0], gen) == E.none
        c.poll(t)
    assert state(c) == "Stable"
    c.poll(SESSION)  # ids[1] was last heard of at time 0
    assert state(c) == "PreparingRebalance"
    assert heartbeat(c, SESSION, ids[1], gen) == E.unknown_member_id
    rejoin = join(c, SESSION + 1, member_id=ids[0])
    assert rejoin.value.generation_id == gen + 1 and len(rejoin.value.members) == 1


def test_rebalance_timeout_drops_members_that_do_not_rejoin():
    c = make()
    ids, gen, leader = form_group(c, 3)
    assert leader == ids[0]
    join(c, 100, member_id=ids[1], protocols=[("range", subscription("t", "u"))])  # metadata change
    staying = join(c, 100, member_id=ids[2])
    for t in range(3000, REBALANCE, 3000):  # the old leader keeps heartbeating but never rejoins
        assert heartbeat(c, t, ids[0], gen) == E.rebalance_in_progress
        c.poll(t)
    assert state(c) == "PreparingRebalance"
    c.poll(100 + REBALANCE)
    result = staying.value
    assert result.generation_id == gen + 1
    assert result.leader == ids[1]  # the old leader did not rejoin: a joined member leads
    assert heartbeat(c, 100 + REBALANCE, ids[0], gen) == E.unknown_member_id


def test_leader_rejoin_forces_rebalance_but_follower_rejoin_does_not():
    c = make()
    ids, gen, leader = form_group(c, 2)
    follower = join(c, 10, member_id=ids[1])
    assert follower.value.error == E.none and follower.value.generation_id == gen
    assert follower.value.members == () and state(c) == "Stable"
    join(c, 20, member_id=leader)
    assert state(c) == "PreparingRebalance"


def test_member_that_never_syncs_is_removed_after_rebalance_timeout():
    c = make()
    boxes = [join_with_id(c, 0) for _ in range(2)]
    c.poll(0)
    leader, lazy = boxes[0].value.member_id, boxes[1].value.member_id
    assert sync(c, 0, leader, 1, assignments={leader: b"A", lazy: b"B"}).value.error == E.none
    for t in range(3000, REBALANCE, 3000):
        heartbeat(c, t, leader, 1)
        heartbeat(c, t, lazy, 1)  # heartbeats do not replace the SyncGroup
        c.poll(t)
    assert state(c) == "Stable"
    c.poll(REBALANCE)
    assert state(c) == "PreparingRebalance"
    assert heartbeat(c, REBALANCE, lazy, 1) == E.unknown_member_id


def test_new_member_that_never_rejoins_is_dropped_after_five_minutes():
    c = make()
    ids, gen, _ = form_group(c, 1, session=600_000)
    stuck = join_with_id(c, 0, session=600_000, rebalance=600_000)
    c.poll(300_000)  # the new-member join timeout, before the rebalance timeout
    assert stuck.value.error == E.unknown_member_id
    rejoin = join(c, 300_001, member_id=ids[0], session=600_000)
    assert rejoin.value.generation_id == gen + 1 and len(rejoin.value.members) == 1


# --- static membership ----------------------------------------------------------------------


def form_static_group(c, instances, now=0, protocols=RANGE):
    boxes = [join(c, now, instance=i, protocols=protocols) for i in instances]  # static members skip MEMBER_ID_REQUIRED
    c.poll(now)
    ids = [b.value.member_id for b in boxes]
    assert all(m.startswith(f"{i}-") for m, i in zip(ids, instances))
    leader = boxes[0].value.leader
    plan = {m: m.encode() for m in ids}
    for m, i in zip(ids, instances):
        sync(c, now, m, 1, assignments=plan if m == leader else None, instance=i)
    assert state(c) == "Stable"
    return ids


def test_static_member_rejoins_without_rebalance():
    c = make()
    ids = form_static_group(c, ["a", "b"])
    restarted = join(c, 100, instance="b")
    result = restarted.value
    assert result.error == E.none and result.generation_id == 1 and result.member_id != ids[1]
    assert state(c) == "Stable"
    # The new id gets the old id's assignment; the old id is fenced.
    assert sync(c, 110, result.member_id, 1, instance="b").value.assignment == ids[1].encode()
    assert heartbeat(c, 120, ids[1], 1, instance="b") == E.fenced_instance_id
    assert join(c, 120, member_id=ids[1], instance="b").value.error == E.fenced_instance_id
    assert commit(c, 120, {("t", 0): 1}, member_id=ids[1], generation=1, instance="b").value == {
        ("t", 0): E.fenced_instance_id}
    assert heartbeat(c, 130, result.member_id, 1, instance="b") == E.none


def test_static_leader_rejoin_learns_it_leads_but_skips_assignment():
    c = make()
    ids = form_static_group(c, ["a", "b"])
    result = join(c, 100, instance="a").value
    assert result.leader == result.member_id and result.skip_assignment
    assert {m.member_id for m in result.members} == {result.member_id, ids[1]}
    assert state(c) == "Stable"
    # Before JoinGroup v9 the old leader id is returned so the client does not reassign.
    old_client = join(c, 200, instance="a", skip=False).value
    assert old_client.leader == result.member_id != old_client.member_id
    assert not old_client.skip_assignment and old_client.members == ()


def test_static_member_with_changed_protocols_triggers_rebalance():
    c = make()
    form_static_group(c, ["a", "b"], protocols=[("range", b""), ("roundrobin", b"")])
    join(c, 100, instance="b", protocols=[("roundrobin", b""), ("range", b"")])
    assert state(c) == "Stable"  # one vote each: range, voted first, stays
    join(c, 100, instance="a", protocols=[("roundrobin", b""), ("range", b"")])
    assert state(c) == "PreparingRebalance"  # now roundrobin would win


def test_static_member_survives_rebalance_timeout_without_rejoining():
    c = make()
    ids = form_static_group(c, ["a", "b"])
    waiting = join(c, 100, member_id=ids[0], instance="a")  # leader asks for a rebalance
    for t in range(3000, REBALANCE, 3000):
        assert heartbeat(c, t, ids[1], 1, instance="b") == E.rebalance_in_progress
        c.poll(t)
    c.poll(100 + REBALANCE)
    result = waiting.value
    assert result.generation_id == 2
    assert {m.member_id for m in result.members} == set(ids)  # b stays though it did not rejoin


def test_static_member_removed_by_instance_id():
    c = make()
    form_static_group(c, ["a", "b"])
    result = c.leave_group(group_id="g", members=[LeavingMember("", "b"), LeavingMember("", "zz")], now_ms=5)
    assert result.member_errors == [E.none, E.unknown_member_id]
    assert state(c) == "PreparingRebalance"


# --- errors leave the group intact -------------------------------------------------------------


def snapshot(c, group="g"):
    d = c.describe_group(group)
    return d.state, d.protocol, tuple((m.member_id, m.assignment) for m in d.members), fetched(c, group)


def test_error_paths_do_not_corrupt_the_group():
    c = make()
    ids, gen, leader = form_group(c, 2)
    assert commit(c, 1, {("t", 0): 5}, member_id=ids[0], generation=gen).value == {("t", 0): E.none}
    before = snapshot(c)
    cases = [
        (sync(c, 2, "stranger", gen).value.error, E.unknown_member_id),
        (sync(c, 2, ids[0], gen + 7).value.error, E.illegal_generation),
        (heartbeat(c, 2, "stranger", gen), E.unknown_member_id),
        (heartbeat(c, 2, ids[1], gen - 1), E.illegal_generation),
        (heartbeat(c, 2, ids[1], gen, group="other"), E.unknown_member_id),
        (join(c, 2, member_id="stranger").value.error, E.unknown_member_id),
        (join(c, 2, group="nope", member_id="stranger").value.error, E.unknown_member_id),
        (join(c, 2, session=1).value.error, E.invalid_session_timeout),
        (join(c, 2, session=10**9).value.error, E.invalid_session_timeout),
        (join(c, 2, group="").value.error, E.invalid_group_id),
        (commit(c, 2, {("t", 0): 9}, member_id=ids[0], generation=gen + 1).value[("t", 0)], E.illegal_generation),
        (commit(c, 2, {("t", 0): 9}, member_id="stranger", generation=gen).value[("t", 0)], E.unknown_member_id),
        (commit(c, 2, {("t", 0): 9}).value[("t", 0)], E.unknown_member_id),  # simple commit, group in use
        (commit(c, 2, {("t", 0): 9}, group="ghost", member_id="m", generation=3).value[("t", 0)],
         E.group_id_not_found),
        (c.leave_group(group_id="g", members=[LeavingMember("stranger")], now_ms=2).member_errors,
         [E.unknown_member_id]),
    ]
    for got, expected in cases:
        assert got == expected
    assert snapshot(c) == before
    assert heartbeat(c, 3, ids[1], gen) == E.none


def test_group_max_size():
    c = make(**{"group.max.size": 2})
    ids, gen, _ = form_group(c, 2)
    before = snapshot(c)
    assert join(c, 1, require_known=False).value.error == E.group_max_size_reached
    assert join(c, 1, member_id="stranger").value.error == E.group_max_size_reached
    assert snapshot(c) == before
    # While rebalancing only members that rejoined count, first come first served.
    leader_rejoin = join(c, 2, member_id=ids[0])
    newcomer = join(c, 3, require_known=False)
    late = join(c, 4, member_id=ids[1])
    assert late.value.error == E.group_max_size_reached
    assert leader_rejoin.value.generation_id == newcomer.value.generation_id == gen + 1
    assert {m.member_id for m in leader_rejoin.value.members} == {ids[0], newcomer.value.member_id}


def test_sync_and_commit_during_rebalance():
    c = make()
    ids, gen, _ = form_group(c, 2)
    join(c, 10, member_id=ids[0])  # leader rejoin: PreparingRebalance
    assert sync(c, 11, ids[1], gen).value.error == E.rebalance_in_progress
    # Commits are still accepted while preparing: the heartbeat tells the member to rejoin.
    assert commit(c, 11, {("t", 0): 3}, member_id=ids[1], generation=gen).value == {("t", 0): E.none}
    second = join(c, 12, member_id=ids[1])
    assert second.value.generation_id == gen + 1 and state(c) == "CompletingRebalance"
    assert commit(c, 13, {("t", 0): 4}, member_id=ids[1], generation=gen + 1).value == {
        ("t", 0): E.rebalance_in_progress}
    assert commit(c, 13, {("t", 0): 4}, member_id=ids[1], generation=gen).value == {("t", 0): E.illegal_generation}
    assert fetched(c) == {("t", 0): 3}


def test_sync_for_empty_or_unknown_group():
    c = make()
    assert sync(c, 0, "m", 1, group="unknown").value.error == E.unknown_member_id
    assert commit(c, 0, {("t", 0): 1}, group="simple").value == {("t", 0): E.none}
    assert sync(c, 0, "m", 0, group="simple").value.error == E.unknown_member_id


def test_failed_assignment_write_sends_everyone_back_to_join():
    store = MemoryStore(auto=False)
    c = make(store)
    boxes = [join_with_id(c, 0) for _ in range(2)]
    c.poll(0)
    leader, follower = boxes[0].value.member_id, boxes[1].value.member_id
    f = sync(c, 0, follower, 1)
    lead = sync(c, 0, leader, 1, assignments={leader: b"A", follower: b"B"})
    store.complete(E.not_leader_or_follower)
    assert f.value.error == lead.value.error == E.not_coordinator
    assert state(c) == "PreparingRebalance"


# --- offsets ----------------------------------------------------------------------------


def test_simple_consumer_commits_to_an_empty_group():
    c = make()
    assert commit(c, 0, {("t", 0): 10, ("t", 1): 20}, group="simple").value == {("t", 0): E.none, ("t", 1): E.none}
    assert fetched(c, "simple") == {("t", 0): 10, ("t", 1): 20}
    assert fetched(c, "simple", [("t", 1), ("u", 0)]) == {("t", 1): 20, ("u", 0): -1}
    d = c.describe_group("simple")
    assert (d.state, d.protocol_type, d.members) == ("Empty", "", ())
    assert fetched(c, "never-seen", [("t", 0)]) == {("t", 0): -1}


def test_commit_is_acknowledged_and_visible_only_once_durable():
    store = MemoryStore(auto=False)
    c = make(store)
    box = commit(c, 0, {("t", 0): 10})
    assert not box.done and fetched(c, partitions=[("t", 0)]) == {("t", 0): -1}
    assert fetched(c, partitions=[("t", 0)], require_stable=True) == {("t", 0): E.unstable_offset_commit}
    store.complete()
    assert box.value == {("t", 0): E.none} and fetched(c) == {("t", 0): 10}
    failed = commit(c, 1, {("t", 0): 11})
    store.complete(E.not_enough_replicas)
    assert failed.value == {("t", 0): E.coordinator_not_available}
    assert fetched(c, require_stable=True) == {("t", 0): 10}


def test_offset_metadata_too_large():
    c = make(**{"offset.metadata.max.bytes": 3})
    box = Box()
    c.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                     offsets={("t", 0): OffsetCommit(1, metadata="abcd"), ("t", 1): OffsetCommit(2, metadata="abc")},
                     now_ms=0, on_complete=box)
    assert box.value == {("t", 0): E.offset_metadata_too_large, ("t", 1): E.none}
    assert fetched(c) == {("t", 1): 2}


def test_empty_group_offsets_expire_after_retention_with_tombstones():
    store = MemoryStore()
    c = make(store, **{"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000})
    ids, gen, _ = form_group(c, 1)
    commit(c, 0, {("t", 0): 7}, member_id=ids[0], generation=gen)
    c.poll(0)
    c.leave_group(group_id="g", members=[LeavingMember(ids[0])], now_ms=120_000)
    c.poll(120_000 + 59_000)  # the retention counts from when the group became Empty
    assert fetched(c) == {("t", 0): 7}
    c.poll(120_000 + 60_000)
    assert c.describe_group("g").error == E.group_id_not_found
    tail = store.records(c.partition_for("g"))[-2:]
    assert tail == [(OffsetCommitKey("g", "t", 0), None), (GroupMetadataKey("g"), None)]


def test_stable_group_expires_only_offsets_of_topics_it_does_not_consume():
    c = make(**{"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000})
    ids, gen, _ = form_group(c, 1)
    commit(c, 0, {("t", 0): 1, ("old", 0): 2}, member_id=ids[0], generation=gen)
    c.poll(0)
    for t in range(3000, 61_001, 3000):
        heartbeat(c, t, ids[0], gen)
        c.poll(t)
    assert fetched(c) == {("t", 0): 1}


def test_explicit_retention_time_uses_the_expire_timestamp():
    store = MemoryStore()
    c = make(store, **{"offsets.retention.check.interval.ms": 1000})
    commit(c, 0, {("t", 0): 1}, retention=5000)
    assert store.log[c.partition_for("g")][0].value[:2] == b"\x00\x01"  # OffsetCommitValue v1
    c.poll(0)
    c.poll(4999)
    assert fetched(c) == {("t", 0): 1}
    c.poll(6000)
    assert c.describe_group("g").error == E.group_id_not_found


def test_delete_groups():
    store = MemoryStore()
    c = make(store)
    form_group(c, 1, group="busy")
    commit(c, 0, {("t", 0): 1, ("t", 1): 2}, group="idle")
    box = Box()
    c.delete_groups(group_ids=["busy", "idle", "missing"], now_ms=5, on_complete=box)
    assert box.value == {"busy": E.non_empty_group, "idle": E.none, "missing": E.group_id_not_found}
    assert c.describe_group("idle").error == E.group_id_not_found
    assert fetched(c, "idle", [("t", 0)]) == {("t", 0): -1}
    tombstones = [k for k, v in store.records(c.partition_for("idle")) if v is None]
    assert tombstones == [OffsetCommitKey("idle", "t", 0), OffsetCommitKey("idle", "t", 1), GroupMetadataKey("idle")]


def test_offset_delete():
    c = make()
    ids, gen, _ = form_group(c, 1)  # subscribed to "t"
    commit(c, 0, {("t", 0): 1, ("u", 0): 2}, member_id=ids[0], generation=gen)
    box = Box()
    c.delete_offsets(group_id="g", partitions=[("t", 0), ("u", 0)], now_ms=1, on_complete=box)
    assert box.value.error == E.none
    assert box.value.partitions == {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none}
    assert fetched(c) == {("t", 0): 1}
    missing = Box()
    c.delete_offsets(group_id="nope", partitions=[("t", 0)], now_ms=1, on_complete=missing)
    assert missing.value.error == E.group_id_not_found


def test_offset_delete_of_last_offset_removes_empty_group():
    c = make()
    commit(c, 0, {("t", 0): 1}, group="simple")
    box = Box()
    c.delete_offsets(group_id="simple", partitions=[("t", 0)], now_ms=1, on_complete=box)
    assert box.value.partitions == {("t", 0): E.none}
    assert c.describe_group("simple").error == E.group_id_not_found


# --- admin views ------------------------------------------------------------------------


def test_list_and_describe_groups():
    c = make()
    form_group(c, 2, group="live")
    commit(c, 0, {("t", 0): 1}, group="idle")
    everything = {(g.group_id, g.state, g.protocol_type) for g in c.list_groups().groups}
    assert everything == {("live", "Stable", "consumer"), ("idle", "Empty", "")}
    assert [g.group_id for g in c.list_groups(states=["stable"]).groups] == ["live"]
    assert c.list_groups(types=["consumer"]).groups == []
    assert len(c.list_groups(types=["Classic"]).groups) == 2
    d = c.describe_group("live")
    assert (d.state, d.protocol_type, d.protocol) == ("Stable", "consumer", "range")
    assert all(m.metadata == RANGE[0][1] and m.assignment.startswith(b"assignment-") for m in d.members)
    assert all(m.client_id == "client" and m.client_host == "/127.0.0.1" for m in d.members)
    join(c, 1, group="live", member_id=d.members[0].member_id)
    rebalancing = c.describe_group("live")
    assert rebalancing.protocol == "" and all(m.metadata == b"" for m in rebalancing.members)


# --- loading ------------------------------------------------------------------------------


def test_coordinator_answers_load_in_progress_and_not_coordinator():
    c = GroupCoordinator(BrokerConfig({"offsets.topic.num.partitions": 4}), MemoryStore())
    partition = c.partition_for("g")
    assert join(c, 0).value.error == E.not_coordinator
    loader = c.begin_load(partition)
    assert join(c, 0).value.error == E.coordinator_load_in_progress
    assert commit(c, 0, {("t", 0): 1}).value == {("t", 0): E.coordinator_load_in_progress}
    assert c.fetch_offsets(group_id="g", partitions=None).error == E.coordinator_load_in_progress
    assert heartbeat(c, 0, "m", 1) == E.none  # answered blindly while loading
    assert sync(c, 0, "m", 1).value.error == E.rebalance_in_progress  # old clients know only this
    assert c.list_groups().error == E.coordinator_load_in_progress
    loader.finish(0)
    assert join(c, 0).value.error == E.member_id_required
    assert c.list_groups().error == E.none


def test_reload_reproduces_groups_and_offsets():
    store = MemoryStore()
    c = make(store)
    ids, gen, leader = form_group(c, 3)
    commit(c, 1, {("t", 0): 10, ("t", 1): 11}, member_id=ids[0], generation=gen)
    commit(c, 2, {("t", 0): 12}, member_id=ids[1], generation=gen)
    commit(c, 3, {("x", 0): 5}, group="simple")
    box = Box()
    c.delete_offsets(group_id="simple", partitions=[("x", 0)], now_ms=4, on_complete=box)
    commit(c, 5, {("y", 0): 6}, group="other")
    before = {g: snapshot(c, g) for g in ("g", "other")}

    reloaded = make(store, **{"group.initial.rebalance.delay.ms": 0})
    assert {g: snapshot(reloaded, g) for g in ("g", "other")} == before
    assert reloaded.describe_group("simple").error == E.group_id_not_found
    assert fetched(reloaded) == {("t", 0): 12, ("t", 1): 11}
    # Members carry on with the same ids and generation; a silent one expires as usual.
    assert heartbeat(reloaded, 100, ids[0], gen) == E.none
    assert heartbeat(reloaded, 100, ids[1], gen) == E.none
    assert sync(reloaded, 100, ids[1], gen).value.assignment == f"assignment-{ids[1]}".encode()
    reloaded.poll(SESSION)
    assert state(reloaded) == "PreparingRebalance"
    assert heartbeat(reloaded, SESSION, ids[2], gen) == E.unknown_member_id


def test_reload_of_an_empty_group_keeps_its_state_timestamp():
    store = MemoryStore()
    c = make(store)
    ids, gen, _ = form_group(c, 1)
    commit(c, 0, {("t", 0): 1}, member_id=ids[0], generation=gen)
    c.leave_group(group_id="g", members=[LeavingMember(ids[0])], now_ms=500)
    reloaded = make(store, **{"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1})
    d = reloaded.describe_group("g")
    assert (d.state, d.protocol_type) == ("Empty", "consumer")
    reloaded.poll(1000)
    reloaded.poll(60_499)
    assert fetched(reloaded) == {("t", 0): 1}
    reloaded.poll(60_500)
    assert reloaded.describe_group("g").error == E.group_id_not_found


def test_unload_answers_waiting_members_not_coordinator():
    c = make()
    first = join_with_id(c, 0)
    c.poll(0)
    leader = first.value.member_id
    second = join_with_id(c, 1)  # rebalance in progress, leader has not rejoined
    c.unload_partition(c.partition_for("g"), now_ms=2)
    assert second.value.error == E.not_coordinator
    assert join(c, 3, member_id=leader).value.error == E.not_coordinator


# --- transactional offsets ----------------------------------------------------------------------


def txn_commit(c, now, offsets, producer_id, group="g"):
    box = Box()
    c.txn_offset_commit(group_id=group, producer_id=producer_id, producer_epoch=0, member_id="",
                        group_instance_id=None, generation_id=-1,
                        offsets={tp: OffsetCommit(o) for tp, o in offsets.items()}, now_ms=now, on_complete=box)
    return box


def test_transactional_offsets_apply_on_commit_and_vanish_on_abort():
    store = MemoryStore()
    c = make(store)
    commit(c, 0, {("t", 0): 1})
    assert txn_commit(c, 1, {("t", 0): 5}, producer_id=7).value == {("t", 0): E.none}
    assert txn_commit(c, 1, {("t", 1): 9}, producer_id=8).value == {("t", 1): E.none}
    assert fetched(c, partitions=[("t", 0), ("t", 1)]) == {("t", 0): 1, ("t", 1): -1}
    assert fetched(c, partitions=[("t", 0)], require_stable=True) == {("t", 0): E.unstable_offset_commit}
    partition = c.partition_for("g")
    c.complete_txn(producer_id=7, partitions=[partition], commit=True, now_ms=2)
    c.complete_txn(producer_id=8, partitions=[partition], commit=False, now_ms=2)
    assert fetched(c, partitions=[("t", 0), ("t", 1)], require_stable=True) == {("t", 0): 5, ("t", 1): -1}
    assert {r.producer_id for r in store.log[partition]} == {-1, 7, 8}


def test_committed_transaction_does_not_override_a_later_plain_commit():
    c = make()
    txn_commit(c, 0, {("t", 0): 5}, producer_id=7)
    commit(c, 1, {("t", 0): 6})
    c.complete_txn(producer_id=7, partitions=[c.partition_for("g")], commit=True, now_ms=2)
    assert fetched(c) == {("t", 0): 6}  # the transactional record is earlier in the log


def test_reload_replays_transaction_markers():
    store = MemoryStore()
    c = make(store)
    partition = c.partition_for("g")
    txn_commit(c, 0, {("t", 0): 5}, producer_id=7)
    txn_commit(c, 0, {("t", 1): 6}, producer_id=8)
    txn_commit(c, 0, {("t", 2): 7}, producer_id=9)
    store.marker(partition, 7, commit=True)
    store.marker(partition, 8, commit=False)
    reloaded = make(store)
    assert fetched(reloaded, partitions=[("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 5, ("t", 1): -1, ("t", 2): -1}
    assert fetched(reloaded, partitions=[("t", 2)], require_stable=True) == {("t", 2): E.unstable_offset_commit}
    reloaded.complete_txn(producer_id=9, partitions=[partition], commit=True, now_ms=1)
    assert fetched(reloaded, partitions=[("t", 2)], require_stable=True) == {("t", 2): 7}


def test_txn_offset_commit_checks_membership_when_given():
    c = make()
    ids, gen, _ = form_group(c, 1)
    box = Box()
    c.txn_offset_commit(group_id="g", producer_id=1, producer_epoch=0, member_id=ids[0], group_instance_id=None,
                        generation_id=gen + 1, offsets={("t", 0): OffsetCommit(1)}, now_ms=1, on_complete=box)
    assert box.value == {("t", 0): E.illegal_generation}
    # Old TxnOffsetCommit versions carry no member: accepted even while the group is in use.
    assert txn_commit(c, 1, {("t", 0): 2}, producer_id=1).value == {("t", 0): E.none}


def test_keys_are_written_to_the_groups_partition():
    store = MemoryStore()
    c = make(store)
    commit(c, 0, {("t", 0): 1}, group="a")
    commit(c, 0, {("t", 0): 1}, group="b")
    for group in ("a", "b"):
        keys = [k for k, _ in store.records(c.partition_for(group))]
        assert OffsetCommitKey(group, "t", 0) in keys
    assert store.log[c.partition_for("a")][0].key == encode_key(OffsetCommitKey("a", "t", 0))


def test_a_failing_callback_does_not_block_others():
    c = make()

    def bad(_):
        raise RuntimeError("boom")

    c.commit_offsets(group_id="g", member_id="", group_instance_id=None, generation_id=-1,
                     offsets={("t", 0): OffsetCommit(1)}, now_ms=0, on_complete=bad)
    assert commit(c, 1, {("t", 1): 2}).value == {("t", 1): E.none}
    assert fetched(c) == {("t", 0): 1, ("t", 1): 2}


# --- less travelled paths -------------------------------------------------------------------


def test_member_that_missed_its_join_response_gets_it_again():
    c = make()
    boxes = [join_with_id(c, 0) for _ in range(2)]
    c.poll(0)
    leader, follower = boxes[0].value.member_id, boxes[1].value.member_id
    again = join(c, 1, member_id=leader).value
    assert (again.generation_id, again.leader, len(again.members)) == (1, leader, 2)
    assert join(c, 1, member_id=follower).value.members == ()
    assert state(c) == "CompletingRebalance"
    join(c, 2, member_id=follower, protocols=[("range", subscription("t", "u"))])
    assert state(c) == "PreparingRebalance"  # changed metadata does force a new generation


def test_static_member_rejoining_while_completing_rebalance_forces_a_new_generation():
    c = make()
    boxes = [join(c, 0, instance=i) for i in ("a", "b")]
    c.poll(0)
    old_b = boxes[1].value.member_id
    waiting_sync = sync(c, 0, old_b, 1, instance="b")
    replacement = join(c, 1, instance="b")
    assert waiting_sync.value.error == E.fenced_instance_id
    assert state(c) == "PreparingRebalance"
    join(c, 2, member_id=boxes[0].value.member_id, instance="a")
    assert replacement.value.error == E.none and replacement.value.generation_id == 2


def test_static_member_replacement_is_undone_if_not_durable():
    store = MemoryStore()
    c = make(store)
    ids = form_static_group(c, ["a", "b"])
    store.auto = False
    restarted = join(c, 10, instance="b")
    assert not restarted.done
    store.complete(E.not_leader_or_follower)
    assert restarted.value.error == E.not_coordinator and restarted.value.member_id == ""
    assert heartbeat(c, 11, ids[1], 1, instance="b") == E.none  # the old id is still the member


def test_leader_assignment_written_after_the_group_moved_on_is_ignored():
    store = MemoryStore(auto=False)
    c = make(store)
    boxes = [join_with_id(c, 0) for _ in range(2)]
    c.poll(0)
    leader, follower = boxes[0].value.member_id, boxes[1].value.member_id
    lead = sync(c, 0, leader, 1, assignments={leader: b"A", follower: b"B"})
    c.leave_group(group_id="g", members=[LeavingMember(follower)], now_ms=1)
    assert lead.value.error == E.rebalance_in_progress
    store.complete()
    assert state(c) == "PreparingRebalance"
    assert join(c, 2, member_id=leader).value.generation_id == 2


def test_pending_member_can_leave():
    c = make()
    pending = join(c, 0)
    result = c.leave_group(group_id="g", members=[LeavingMember(pending.value.member_id)], now_ms=1)
    assert result.member_errors == [E.none]
    assert join(c, 1, member_id=pending.value.member_id).value.error == E.unknown_member_id


def test_static_members_that_all_fail_to_rejoin_keep_the_group_waiting():
    c = make()
    ids = form_static_group(c, ["a", "b"])
    c.leave_group(group_id="g", members=[LeavingMember("", "a")], now_ms=1)  # admin removes a
    assert state(c) == "PreparingRebalance"
    for t in range(3000, 2 * REBALANCE, 3000):  # b heartbeats but does not rejoin
        heartbeat(c, t, ids[1], 1, instance="b")
        c.poll(t)
    assert state(c) == "PreparingRebalance"  # no member rejoined: the rebalance waits again
    back = join(c, 2 * REBALANCE, member_id=ids[1], instance="b")
    assert back.value.generation_id == 2 and back.value.leader == ids[1]


def test_concurrent_commits_of_one_partition_keep_log_order():
    store = MemoryStore(auto=False)
    c = make(store)
    first, second = commit(c, 0, {("t", 0): 1}), commit(c, 0, {("t", 0): 2})
    store.complete()
    assert first.value == second.value == {("t", 0): E.none}
    assert fetched(c, require_stable=True) == {("t", 0): 2}


def test_failed_transactional_commit_is_not_left_pending():
    store = MemoryStore(auto=False)
    c = make(store)
    box = txn_commit(c, 0, {("t", 0): 5}, producer_id=3)
    store.complete(E.not_leader_or_follower)
    assert box.value == {("t", 0): E.not_coordinator}
    assert fetched(c, partitions=[("t", 0)], require_stable=True) == {("t", 0): -1}
    ghost = Box()
    c.txn_offset_commit(group_id="ghost", producer_id=3, producer_epoch=0, member_id="m", group_instance_id=None,
                        generation_id=2, offsets={("t", 0): OffsetCommit(1)}, now_ms=1, on_complete=ghost)
    assert ghost.value == {("t", 0): E.illegal_generation}


def test_offset_delete_needs_an_empty_group_unless_it_is_a_consumer_group():
    c = make()
    join_with_id(c, 0, group="conn", protocol_type="connect")
    c.poll(0)
    box = Box()
    c.delete_offsets(group_id="conn", partitions=[("t", 0)], now_ms=1, on_complete=box)
    assert box.value.error == E.non_empty_group


def test_unreadable_records_are_skipped_on_load():
    store = MemoryStore()
    c = make(store)
    commit(c, 0, {("t", 0): 1})
    partition = c.partition_for("g")
    store.log[partition].append(StoredRecord(len(store.log[partition]),
                                             encode_key(OffsetCommitKey("g", "t", 1)), b"\x00\x09garbage"))
    reloaded = make(store)
    assert fetched(reloaded) == {("t", 0): 1}


def test_reload_keeps_static_members():
    store = MemoryStore()
    c = make(store)
    ids = form_static_group(c, ["a", "b"])
    reloaded = make(store)
    assert heartbeat(reloaded, 1, ids[0], 1, instance="a") == E.none
    restarted = join(reloaded, 2, instance="b").value
    assert restarted.generation_id == 1 and state(reloaded) == "Stable"
    assert heartbeat(reloaded, 3, ids[1], 1, instance="b") == E.fenced_instance_id


def test_deleted_topics_lose_their_offsets_everywhere():
    store = MemoryStore()
    c = make(store)
    ids, gen, _ = form_group(c, 1)
    commit(c, 0, {("t", 0): 1, ("gone", 0): 2}, member_id=ids[0], generation=gen)
    commit(c, 0, {("gone", 1): 3}, group="simple")
    txn_commit(c, 0, {("gone", 2): 4}, producer_id=5, group="other")
    c.on_topics_deleted(["gone"], now_ms=1)
    assert fetched(c) == {("t", 0): 1}
    assert c.describe_group("simple").error == E.group_id_not_found  # nothing left: it dies
    c.complete_txn(producer_id=5, partitions=[c.partition_for("other")], commit=True, now_ms=2)
    assert fetched(c, "other", [("gone", 2)]) == {("gone", 2): -1}
    assert (OffsetCommitKey("g", "gone", 0), None) in store.records(c.partition_for("g"))
    reloaded = make(store)
    assert fetched(reloaded) == {("t", 0): 1}
    assert fetched(reloaded, "simple", [("gone", 1)]) == {("gone", 1): -1}


def test_a_session_that_ran_out_is_gone_for_the_next_request_without_a_poll():
    """Expiry is on time: whatever call comes after the deadline sees the member gone, so a
    DeleteGroups right after the session timeout succeeds where a late timer left NON_EMPTY_GROUP."""
    c = make()
    form_group(c, 1)
    assert c.next_deadline() == SESSION
    box = Box()
    c.delete_groups(group_ids=["g"], now_ms=SESSION, on_complete=box)  # at the deadline: still a member
    assert box.value == {"g": E.non_empty_group}
    box = Box()
    c.delete_groups(group_ids=["g"], now_ms=SESSION + 1, on_complete=box)  # no poll in between
    assert box.value == {"g": E.none}
