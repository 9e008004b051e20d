"""`ConfigStore` against a real nats-server: puts go out in batches of asynchronous
publishes and every acknowledged one is stored and readable; a put nobody acknowledges is
an error that leaves `stored` as it was; `load` reads the bucket in one pass and skips
what does not decode."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import open_bucket
from aggregator.reconcile.apply import ConfigStore
from aggregator.reconcile.plan import DeleteDesiredConfig, PutDesiredConfig
from proto import subjects
from proto.codec import decode
from proto.messages.config import DesiredConfig

pytestmark = pytest.mark.integration

_names = itertools.count()


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def kv(client: Client) -> AsyncIterator[KeyValue]:
    name = f"store-configs-{next(_names)}"
    yield await open_bucket(client.jetstream(), name)
    await client.jetstream().delete_key_value(name)


def put(node: str, generation: int = 1) -> PutDesiredConfig:
    return PutDesiredConfig(
        node=node, config=DesiredConfig(node=node, generation=generation), policy="p"
    )


async def test_puts_in_several_batches_are_all_stored(kv: KeyValue) -> None:
    store = ConfigStore(kv, batch=4)
    nodes = [f"gpu-{i:02d}" for i in range(10)]
    assert await store.apply([put(n) for n in nodes]) == []
    assert sorted(store.stored) == nodes
    entry = await kv.get(subjects.node_token("gpu-07"))
    assert entry.value is not None
    assert decode(entry.value, DesiredConfig).node == "gpu-07"
    assert await store.apply([put("gpu-07", 2), DeleteDesiredConfig(node="gpu-03")]) == []
    assert store.stored["gpu-07"].generation == 2 and "gpu-03" not in store.stored
    assert sorted(await ConfigStore(kv).load()) == sorted(set(nodes) - {"gpu-03"})


async def test_unacknowledged_puts_are_errors_and_leave_stored_alone(
    client: Client, kv: KeyValue
) -> None:
    store = ConfigStore(kv, batch=2)
    assert await store.apply([put("gpu-a")]) == []
    await client.jetstream().delete_key_value(kv._name)  # nobody answers the publishes
    try:
        errors = await store.apply([put("gpu-a", 2), put("gpu-b"), put("gpu-c")])
        assert len(errors) == 3 and all(subjects.KV_CONFIG in e for e in errors)
        assert "gpu-b" in " ".join(errors)
        assert store.stored == {"gpu-a": DesiredConfig(node="gpu-a", generation=1)}
    finally:
        await open_bucket(client.jetstream(), kv._name)  # for the fixture's cleanup


async def test_load_skips_undecodable_entries(
    kv: KeyValue, caplog: pytest.LogCaptureFixture
) -> None:
    await ConfigStore(kv).apply([put("gpu-a"), put("gpu-b")])
    await kv.put("gpu-bad", b"\xc1 not msgpack")
    await kv.delete(subjects.node_token("gpu-b"))
    store = ConfigStore(kv)
    with caplog.at_level(logging.WARNING, logger="aggregator.reconcile.apply"):
        assert list(await store.load()) == ["gpu-a"]
    assert "gpu-bad" in caplog.text
    assert list(store.stored) == ["gpu-a"]


async def test_puts_while_the_server_is_down_time_out_as_errors(own_nats: NatsServer) -> None:
    nc = await nats.connect(own_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        store = ConfigStore(await open_bucket(nc.jetstream(), "store-configs-down"), timeout=0.5)
        own_nats.stop(kill=True)
        errors = await store.apply([put("gpu-a"), put("gpu-b")])
        assert len(errors) == 2 and "no ack in 0.5s" in errors[0]
        assert store.stored == {}
    finally:
        await nc.close()


async def test_every_acknowledged_write_is_announced_with_its_revision(
    client: Client, kv: KeyValue
) -> None:
    heard: list[tuple[str, int, bytes | None]] = []

    async def announce(node: str, revision: int, value: bytes | None) -> None:
        heard.append((node, revision, value))

    store = ConfigStore(kv, batch=2, announce=announce)
    assert await store.apply([put("gpu-a"), put("gpu-b"), put("gpu-c")]) == []
    assert sorted(n for n, _, _ in heard) == ["gpu-a", "gpu-b", "gpu-c"]
    for node, revision, value in heard:
        entry = await kv.get(subjects.node_token(node))
        assert (entry.revision, entry.value) == (revision, value)  # what the KV holds
    assert await store.apply([DeleteDesiredConfig(node="gpu-b")]) == []
    node, revision, value = heard[-1]
    assert (node, value) == ("gpu-b", None) and revision > max(r for _, r, _ in heard[:3])
    await client.jetstream().delete_key_value(kv._name)  # nobody acknowledges now
    try:
        assert len(await store.apply([put("gpu-a", 2)])) == 1
        assert len(heard) == 4  # a write that failed is not announced
    finally:
        await open_bucket(client.jetstream(), kv._name)
