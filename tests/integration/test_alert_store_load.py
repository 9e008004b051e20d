"""`load_states` reads every alert state while another writer updates the bucket: nats-py's
key listing misses keys written meanwhile (a missed firing alert would fire again)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from aggregator.alerts.store import load_states
from aggregator.natsserver import NatsServer
from proto.codec import encode
from tests.unit.test_shard_writes import NODES, firing

pytestmark = pytest.mark.integration


async def test_every_state_is_loaded_while_another_writer_updates_them(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    stop = asyncio.Event()
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="alert-store-load", history=1)
        states = [firing(n) for n in NODES[:30]]
        for state in states:
            await kv.put(state.alert.fingerprint, encode(state))
        await kv.put("junk", b"\xc1")  # undecodable: skipped, the rest still loads

        async def other_writer() -> None:  # keeps re-persisting the same states
            for i in range(100_000):
                if stop.is_set():
                    return
                state = states[i % len(states)]
                await kv.put(state.alert.fingerprint, encode(state))

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(other_writer())
            for _ in range(20):
                loaded = await load_states(kv)
                assert sorted(loaded) == sorted(s.alert.fingerprint for s in states)
            stop.set()
        await kv.delete(states[0].alert.fingerprint)
        assert states[0].alert.fingerprint not in await load_states(kv)
    finally:
        stop.set()
        await nc.close()


async def test_an_empty_bucket_loads_nothing(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="alert-store-empty", history=1)
        assert await load_states(kv) == {}
    finally:
        await nc.close()
