"""The controller's asyncio edge on the in-memory store: watches marshalled onto the loop,
store calls on one worker thread, requests queued per broker and retried until delivered."""

from __future__ import annotations

import asyncio
import threading
import uuid

from ottla.cluster.memory_store import MemoryZooKeeper
from ottla.cluster.store import BrokerRegistration, TopicAssignment
from ottla.controller import ControllerConfig
from ottla.controller.service import ControllerService


async def eventually(predicate, timeout=20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_service_elects_sends_and_fails_over():
    async def main():
        zk = MemoryZooKeeper()
        sent: list = []
        threads: set = set()
        unreachable = {3}

        async def send(request):
            if request.destination in unreachable:
                raise ConnectionRefusedError("broker 3 is not listening yet")
            sent.append(request)
            if request.kind == "StopReplica":
                return {(p.topic, p.partition): 0 for p in request.payload.partitions}
            return None

        services = {}
        for broker_id in (1, 2, 3):
            store = zk.session()
            store.register_broker(BrokerRegistration(broker_id, "127.0.0.1", 9000 + broker_id))
            original = store.live_brokers

            def tracking(original=original):
                threads.add(threading.current_thread().name)
                return original()
            store.live_brokers = tracking
            services[broker_id] = ControllerService(broker_id, store, ControllerConfig(), send, tick_interval_s=0.05)
        for service in services.values():
            await service.start()
        await eventually(lambda: sum(s.active for s in services.values()) == 1)
        first = next(b for b, s in services.items() if s.active)
        others = [b for b in services if b != first]
        services[others[0]].store.create_topic(TopicAssignment("t", uuid.uuid4(), {0: (1, 2, 3)}), {})
        await eventually(lambda: any(r.kind == "LeaderAndIsr" and r.destination == 2 for r in sent))
        assert not any(r.destination == 3 for r in sent)
        unreachable.clear()  # broker 3 starts listening: the queued requests go out, in order
        await eventually(lambda: any(r.kind == "LeaderAndIsr" and r.destination == 3 for r in sent))
        kinds_to_3 = [r.kind for r in sent if r.destination == 3]
        assert kinds_to_3.index("UpdateMetadata") < kinds_to_3.index("LeaderAndIsr")
        assert threads and all(name.startswith("ottla-controller") for name in threads)
        # The controller's session expires: another broker takes over with a new epoch.
        services[first].store.expire_session()
        await eventually(lambda: zk.controller_epoch.epoch == 2
                         and sum(s.active for s in services.values()) == 1)
        assert next(b for b, s in services.items() if s.active) == zk.controller[0]
        for service in services.values():
            await service.stop()
            service.store.close()

    asyncio.run(main())


def test_an_event_the_store_cuts_off_part_way_is_finished_by_re_reading_the_cluster():
    """Broker 2 dies; the controller sees it, but its first leader-election write finds
    ZooKeeper unreachable. Replaying the event would find no broker change any more: the
    controller must re-read the cluster and still move the leadership off broker 2."""
    from ottla.cluster.store import StoreUnavailable

    async def main():
        zk = MemoryZooKeeper()
        sent: list = []

        async def send(request):
            sent.append(request)
            if request.kind == "StopReplica":
                return {(p.topic, p.partition): 0 for p in request.payload.partitions}
            return None

        stores = {b: zk.session() for b in (1, 2)}
        for broker_id, store in stores.items():
            store.register_broker(BrokerRegistration(broker_id, "127.0.0.1", 9000 + broker_id))
        controller = ControllerService(1, stores[1], ControllerConfig(), send, tick_interval_s=0.05)
        await controller.start()
        await eventually(lambda: controller.active)
        stores[1].create_topic(TopicAssignment("t", uuid.uuid4(), {0: (2, 1)}), {})
        await eventually(lambda: zk.states.get(("t", 0)) is not None and zk.states[("t", 0)].leader == 2)

        cut_off = []
        original = stores[1].update_partition_states

        def unreachable_once(*args, **kwargs):
            if not cut_off:
                cut_off.extend(args[0])
                raise StoreUnavailable("ZooKeeper does not answer")
            return original(*args, **kwargs)
        stores[1].update_partition_states = unreachable_once
        sent.clear()
        stores[2].expire_session()  # broker 2 is gone
        await eventually(lambda: zk.states[("t", 0)].leader == 1)
        assert cut_off == [("t", 0)]
        await eventually(lambda: any(r.kind == "UpdateMetadata" and r.destination == 1
                                     and all(b.broker_id != 2 for b in r.payload.live_brokers) for r in sent))
        await controller.stop()
        for store in stores.values():
            store.close()

    asyncio.run(main())


def test_a_controller_stopping_after_its_own_controlled_shutdown_delivers_the_moves_first():
    """The controller's broker shuts down: its ControlledShutdown moves the leadership of
    `t-0` to broker 2, and the broker then stops its controller. The LeaderAndIsr making
    broker 2 leader, and the UpdateMetadata after it, were still queued; they were dropped,
    and broker 2 (named leader in ZooKeeper and, soon, in every Metadata answer) did not lead
    until the next controller's failover: its coordinators answered NOT_COORDINATOR."""

    async def main():
        zk = MemoryZooKeeper()
        delivered: list = []
        slow = asyncio.Event()  # broker 2 answers only once the controller is stopping
        slow.set()

        async def send(request):
            if request.destination == 2:
                await slow.wait()
            delivered.append(request)
            return None

        stores = {b: zk.session() for b in (1, 2)}
        registrations = {b: store.register_broker(BrokerRegistration(b, "127.0.0.1", 9000 + b))
                         for b, store in stores.items()}
        controller = ControllerService(1, stores[1], ControllerConfig(), send, tick_interval_s=0.05)
        await controller.start()
        await eventually(lambda: controller.active)
        stores[1].create_topic(TopicAssignment("t", uuid.uuid4(), {0: (1, 2)}), {})
        await eventually(lambda: any(r.kind == "LeaderAndIsr" and r.destination == 2 for r in delivered))
        delivered.clear()
        slow.clear()
        error, remaining = await controller.controlled_shutdown(1, registrations[1].epoch)
        assert (error, remaining) == (0, set()) and zk.states[("t", 0)].leader == 2
        stopping = asyncio.get_running_loop().create_task(controller.stop())
        for _ in range(10):
            await asyncio.sleep(0)
        slow.set()
        await stopping
        to_2 = [(r.kind, [p.leader for p in r.payload.partitions]) for r in delivered if r.destination == 2]
        assert to_2[:2] == [("LeaderAndIsr", [2]), ("UpdateMetadata", [2])], to_2
        for store in stores.values():
            store.close()

    asyncio.run(main())
