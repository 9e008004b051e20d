"""`--kv-replicas`: every bucket the aggregator uses gets N copies in a JetStream cluster
(created so, or raised), and a single server refuses N > 1 with an error naming the flag."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from aggregator.bus.natsserver import NatsServer
from aggregator.errors import StoreError
from aggregator.fleet.store import ensure_buckets
from aggregator.service import KV_BUCKETS
from tests.support.jscluster import js_cluster
from tests.support.waits import wait_until

pytestmark = pytest.mark.slow  # a 3-server cluster elects its meta leader first (~5 s)


async def test_buckets_are_created_or_raised_to_three_replicas(tmp_path: Path) -> None:
    with js_cluster(tmp_path) as servers:
        urls = [s.url for s in servers.values()]
        nc = await nats.connect(servers=urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        try:
            js = nc.jetstream()

            async def one_replica_bucket() -> bool:  # retried until the meta leader exists
                try:
                    await js.create_key_value(bucket=KV_BUCKETS[0], history=1, replicas=1)
                except Exception:  # "no JetStream meta leader" until one is elected
                    return False
                return True

            await wait_until(one_replica_bucket, timeout=30, interval=0.2, what="meta leader")
            await ensure_buckets(js, KV_BUCKETS, replicas=3)
            for name in KV_BUCKETS:
                info = await js.stream_info(f"KV_{name}")
                assert info.config.num_replicas == 3, name
            # Idempotent: a second start changes nothing and does not fail.
            await ensure_buckets(js, KV_BUCKETS, replicas=3)
        finally:
            await nc.close()


async def test_a_single_server_refuses_three_replicas_naming_the_flag(
    own_nats: NatsServer,
) -> None:
    nc = await nats.connect(own_nats.url)
    try:
        with pytest.raises(StoreError, match=r"--kv-replicas 3"):
            await ensure_buckets(nc.jetstream(), KV_BUCKETS[:1], replicas=3)
        await ensure_buckets(nc.jetstream(), KV_BUCKETS, replicas=1)  # the default works
    finally:
        await nc.close()
