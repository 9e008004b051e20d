"""Fault: the stream leader of a replicated (R3) KV bucket is SIGKILLed in a 3-server
JetStream cluster on loopback. Writes and reads resume after re-election, core publish
and subscribe keep working on the survivors, and no acknowledged write is lost. And a
cluster without JetStream quorum: the leader lease bucket is waited for, not given up on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.errors import ServiceUnavailableError
from nats.js.kv import KeyValue

from aggregator.replicas.leader import NatsLease
from proto.runtime.natsflush import flush_in_order
from tests.support.jscluster import js_cluster
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUCKET = "faults-r3"


async def create_r3_bucket(nc: NatsClient) -> KeyValue:
    """The meta leader is elected a few seconds after start; retry until then."""
    made: list[KeyValue] = []

    async def created() -> bool:
        try:
            made.append(await nc.jetstream().create_key_value(bucket=BUCKET, history=1, replicas=3))
        except (NatsError, TimeoutError):
            return False
        return True

    await wait_until(created, timeout=20, interval=0.2, what="R3 bucket created")
    return made[0]


async def put_acknowledged(kv: KeyValue, key: str, value: bytes) -> None:
    """Retry a put until the cluster acknowledges it (during an election it cannot)."""

    async def acknowledged() -> bool:
        try:
            await kv.put(key, value)
        except (NatsError, TimeoutError):
            return False
        return True

    await wait_until(acknowledged, timeout=30, interval=0.1, what=f"put {key} acknowledged")


async def read_settled(kv: KeyValue, key: str) -> bytes | None:
    """A key's value read through a server that may still be catching up with the new
    stream leader: "JetStream system temporarily unavailable" (503) and timeouts are
    retried, bounded; a missing key is not (that would be a lost write)."""
    got: list[bytes | None] = []

    async def read() -> bool:
        try:
            got.append((await kv.get(key)).value)
        except (ServiceUnavailableError, TimeoutError):
            return False
        return True

    await wait_until(read, timeout=30, interval=0.1, what=f"read {key} through a survivor")
    return got[-1]


async def stream_leader(nc: NatsClient) -> str | None:
    try:
        info = await nc.jetstream().stream_info(f"KV_{BUCKET}")
    except (NatsError, TimeoutError):
        return None
    return info.cluster.leader if info.cluster is not None else None


async def test_r3_kv_survives_killing_the_stream_leader(tmp_path: Path) -> None:
    with js_cluster(tmp_path) as servers:
        urls = [s.url for s in servers.values()]
        nc = await nats.connect(servers=urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        try:
            kv = await create_r3_bucket(nc)
            acked: dict[str, bytes] = {}
            for i in range(50):
                key, value = f"k{i:03d}", f"before-{i}".encode()
                await put_acknowledged(kv, key, value)
                acked[key] = value
            leader = await stream_leader(nc)
            assert leader in servers
            await asyncio.to_thread(servers[leader].stop, kill=True)
            survivors = [s.url for name, s in servers.items() if name != leader]

            for i in range(50, 100):  # writes continue once a new leader is elected
                key, value = f"k{i:03d}", f"after-{i}".encode()
                await put_acknowledged(kv, key, value)
                acked[key] = value
            new_leader = await stream_leader(nc)
            assert new_leader is not None and new_leader != leader
            # Core messaging on the survivors: publish on one, receive on the other.
            a = await nats.connect(survivors[0])
            b = await nats.connect(survivors[1])
            try:
                sub = await b.subscribe("faults.ping")
                await flush_in_order(b)

                async def delivered() -> bool:  # interest crosses the route asynchronously
                    await a.publish("faults.ping", b"ping")
                    try:
                        return (await sub.next_msg(timeout=0.1)).data == b"ping"
                    except TimeoutError:
                        return False

                await wait_until(delivered, what="ping across the surviving servers")
                # No acknowledged write lost, read through a survivor.
                kv_b = await b.jetstream().key_value(BUCKET)
                for key, value in acked.items():
                    assert await read_settled(kv_b, key) == value, key
            finally:
                await a.close()
                await b.close()
        finally:
            await nc.close()


async def test_the_lease_bucket_is_waited_for_while_the_cluster_has_no_quorum(
    tmp_path: Path,
) -> None:
    """A replica started while its NATS cluster has no JetStream quorum (two of three
    servers down) keeps trying to open the leader lease bucket instead of exiting, and
    opens it once a second server is back."""
    with js_cluster(tmp_path) as servers:
        nc = await nats.connect(servers["n1"].url)
        try:
            await create_r3_bucket(nc)  # the cluster formed: its peers known to each other
            for name in ("n2", "n3"):
                await asyncio.to_thread(servers[name].stop)
            js = nc.jetstream(timeout=1.0)
            with pytest.raises((TimeoutError, ServiceUnavailableError)):  # no quorum: no KV
                await js.create_key_value(bucket="probe", history=1)
            opening = asyncio.ensure_future(NatsLease.open(js, ttl_s=6.0))
            await asyncio.to_thread(servers["n2"].restart)
            lease = await asyncio.wait_for(opening, timeout=60)
            assert await lease.read() is None  # an empty lease bucket, readable
        finally:
            await nc.close()
