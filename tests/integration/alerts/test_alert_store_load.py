"""`load_states` reads every alert state while another writer updates the bucket: nats-py's
key listing misses keys written meanwhile (a missed firing alert would fire again)."""

from __future__ import annotations

import asyncio

import msgspec
import nats
import pytest

from aggregator.alerts.store import AlertStore, load_states
from aggregator.bus.natsserver import NatsServer
from proto.codec import encode
from tests.unit.aggregator.replicas.test_shard_writes import NODES, firing

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


async def test_a_burst_is_saved_in_batches_and_failed_keys_stay_pending(
    nats_server: NatsServer,
) -> None:
    """100 states (more than WRITES_IN_FLIGHT) written at once; the server refuses the
    oversized ones (the bucket's max value size): counted, named, kept for the next save,
    and the others stored all the same."""
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(
            bucket="alert-store-burst", history=1, max_value_size=400
        )
        small = {s.alert.fingerprint: s for s in (firing(f"n{i:03d}") for i in range(90))}
        big = {
            s.alert.fingerprint: msgspec.structs.replace(
                s, alert=msgspec.structs.replace(s.alert, message="x" * 1000)
            )
            for s in (firing(f"big{i}") for i in range(10))
        }
        assert (
            max(map(len, map(encode, small.values()))) < 400 < len(encode(next(iter(big.values()))))
        )
        states = small | big
        store = AlertStore(kv)
        assert await store.save(states, states, ()) == (90, 10)
        assert store.pending == 10 and store.last_error is not None
        assert "alert state write port-down-big" in store.last_error
        assert sorted(await load_states(kv)) == sorted(small)
        gone = sorted(small)[:40]
        kept = {k: v for k, v in states.items() if k not in gone}
        assert await store.save(kept, (), gone) == (40, 10)  # the big ones retried, failing
        assert sorted(await load_states(kv)) == sorted(set(small) - set(gone))
        assert store.pending == 10
    finally:
        await nc.close()
