"""Leader election: two electors on a real nats-server (KV lease) and on kmock's
KubernetesEmulator (coordination.k8s.io/v1 Lease): one leader, take-over after a crash,
immediate hand-over on a clean stop, step-down when the store goes away."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import kmock
import nats
import pytest

from aggregator.bus.natsserver import NatsServer
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.replicas.leader import (
    KubeLease,
    LeaderElector,
    LeaderSettings,
    LeaseStore,
    NatsLease,
    Observed,
    decide,
)
from tests.support.waits import wait_until

# Short times keep the tests quick; production defaults are 10 s / 3 s / 1 s.
FAST = {"ttl_s": 2.0, "renew_every_s": 0.5, "retry_every_s": 0.2}
StoreFactory = Callable[[float], Awaitable[LeaseStore]]


@pytest.mark.parametrize(
    ("observed", "unchanged_for", "expected"),
    [
        pytest.param(None, None, "create", id="absent"),
        pytest.param(Observed(holder="me", stamp="1"), 0.0, "renew", id="mine"),
        pytest.param(Observed(holder="", stamp="1"), 0.0, "take", id="released"),
        pytest.param(Observed(holder="other", stamp="1"), None, "wait", id="first-sight"),
        pytest.param(Observed(holder="other", stamp="1"), 9.9, "wait", id="live"),
        pytest.param(Observed(holder="other", stamp="1"), 10.0, "take", id="expired"),
    ],
)
def test_decide(observed: Observed | None, unchanged_for: float | None, expected: str) -> None:
    assert decide(observed, "me", unchanged_for, 10.0) == expected


class Replica:
    def __init__(self, store: LeaseStore, settings: LeaderSettings) -> None:
        self.history: list[bool] = []  # every on_change call
        self.elector = LeaderElector(store, settings, on_change=self.history.append)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


@asynccontextmanager
async def replicas(
    make_store: StoreFactory, count: int, **settings: float
) -> AsyncIterator[list[Replica]]:
    merged = {**FAST, **settings}
    group: list[Replica] = []
    for i in range(count):
        store = await make_store(merged["ttl_s"])
        group.append(Replica(store, LeaderSettings(identity=f"r{i}", **merged)))
    async with asyncio.TaskGroup() as tasks:
        for replica in group:
            replica.task = tasks.create_task(replica.elector.run(replica.stop))
        try:
            yield group
        finally:
            for replica in group:
                replica.stop.set()


def leaders(group: list[Replica]) -> list[Replica]:
    return [r for r in group if r.elector.is_leader and r.task is not None and not r.task.done()]


@pytest.fixture
async def nats_store(nats_server: NatsServer) -> AsyncIterator[StoreFactory]:
    bucket = f"leader-{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:

        async def make(ttl_s: float) -> LeaseStore:
            client = await nats.connect(nats_server.url)
            stack.push_async_callback(client.close)
            return await NatsLease.open(client.jetstream(), ttl_s, bucket=bucket)

        yield make


@pytest.fixture
async def kube_store() -> AsyncIterator[StoreFactory]:
    emulator = kmock.KubernetesEmulator()
    emulator.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(
        kind="Lease", namespaced=True
    )
    async with emulator, kmock.Server(emulator) as server, AsyncExitStack() as stack:

        async def make(ttl_s: float) -> LeaseStore:
            kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
            stack.push_async_callback(kube.close)
            return KubeLease(kube, ttl_s)

        yield make


@pytest.fixture(params=["nats", "kubernetes"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    name = "nats_store" if request.param == "nats" else "kube_store"
    factory: StoreFactory = request.getfixturevalue(name)
    return factory


async def test_exactly_one_leader(make_store: StoreFactory) -> None:
    async with replicas(make_store, 3) as group:
        await wait_until(lambda: len(leaders(group)) == 1, what="a leader")
        (leader,) = leaders(group)
        # Several renew periods later, still the same single leader.
        await wait_until(
            lambda: leader.history.count(True) == 1 and len(leaders(group)) == 1,
            what="a stable leader",
        )
        for replica in group:
            if replica is not leader:
                assert replica.history == []


async def test_crashed_leader_is_replaced_after_the_ttl(make_store: StoreFactory) -> None:
    async with replicas(make_store, 2) as group:
        await wait_until(lambda: len(leaders(group)) == 1, what="a leader")
        (first,) = leaders(group)
        assert first.task is not None
        first.task.cancel()  # a crash: nothing released, the lease must expire
        await asyncio.wait({first.task})
        (other,) = [r for r in group if r is not first]
        await wait_until(
            lambda: other.elector.is_leader, timeout=4 * FAST["ttl_s"], what="take-over"
        )


async def test_clean_stop_hands_over_at_once(make_store: StoreFactory) -> None:
    # A TTL far longer than the wait: only the release can explain the hand-over.
    async with replicas(make_store, 2, ttl_s=60.0) as group:
        await wait_until(lambda: len(leaders(group)) == 1, what="a leader")
        (first,) = leaders(group)
        first.stop.set()
        assert first.task is not None
        await asyncio.wait({first.task})
        assert first.history == [True, False]
        (other,) = [r for r in group if r is not first]
        await wait_until(lambda: other.elector.is_leader, timeout=10, what="hand-over")


async def test_leader_steps_down_when_nats_goes_away(own_nats: NatsServer) -> None:
    client = await nats.connect(own_nats.url, max_reconnect_attempts=-1)
    try:
        store = await NatsLease.open(client.jetstream(), FAST["ttl_s"])
        elector = LeaderElector(store, LeaderSettings(identity="solo", **FAST))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(elector.run(stop))
            await asyncio.wait_for(elector.leading.wait(), 10)
            own_nats.stop()
            await wait_until(lambda: not elector.is_leader, what="step-down")
            own_nats.start()
            await wait_until(lambda: elector.is_leader, timeout=30, what="leads again")
            stop.set()
    finally:
        await client.close()
