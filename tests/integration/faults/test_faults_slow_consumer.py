"""Fault at the NATS server: an alert subscriber that stops reading is cut off by
nats-server as a slow consumer (small `max_pending` and `write_deadline`), while the
aggregator's own connection stays, every counter batch is applied and alerts go out.

The server's monitoring endpoint (`-m`, on 127.0.0.1) is the witness: `/varz` counts the
slow consumer, `/connz` no longer lists it, `/connz?state=closed` says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.service import AggregatorService
from proto import subjects
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.faults import free_port, stalled_subscriber
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALLED = "stalled-alert-reader"
NOISE = "nicfleet.v1.alert.info.noise._fleet"
# 1 MiB of pending bytes per client, 1 s to finish a write: the stalled reader's 12 MB
# cannot fit, the aggregator's traffic (a few KiB per batch, read at once) always does.
SERVER_CONF = 'max_pending: 1048576\nwrite_deadline: "1s"\n'


@pytest.fixture
def slow_nats(tmp_path: Path) -> Iterator[tuple[NatsServer, str]]:
    conf = tmp_path / "slow.conf"
    conf.write_text(SERVER_CONF)
    port = free_port()
    settings = NatsServerSettings(
        store_dir=tmp_path / "nats-store", extra_args=("-c", str(conf), "-m", str(port))
    )
    with NatsServer(settings) as server:
        yield server, f"http://127.0.0.1:{port}"


async def monitor(api: httpx.AsyncClient, path: str) -> dict[str, Any]:
    response = await api.get(path)
    response.raise_for_status()
    doc: dict[str, Any] = response.json()
    return doc


def named(connz: dict[str, Any], name: str) -> set[int]:
    return {int(c["cid"]) for c in connz.get("connections") or () if c.get("name") == name}


def ingested(agg: AggregatorService, kind: str) -> float:
    value = agg.metrics.registry.get_sample_value("nicfleet_ingest_messages_total", {"kind": kind})
    return value or 0.0


async def test_slow_alert_consumer_is_disconnected_while_ingest_goes_on(
    slow_nats: tuple[NatsServer, str], tmp_path: Path
) -> None:
    server, monitoring = slow_nats
    assert server.port is not None
    node = "slow-cut-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    stalled = await asyncio.to_thread(stalled_subscriber, server.port, STALLED)
    nc = await nats.connect(server.url)
    try:
        healthy = await nc.subscribe(f"nicfleet.v1.alert.critical.port-down.{node}")
        async with (
            httpx.AsyncClient(base_url=monitoring) as api,
            aggregator(server.url) as agg,
        ):
            async with agent(server.url, root, node) as running:
                await wait_until(lambda: ingested(agg, "counters") >= 2, what="counters")
                connz = await monitor(api, "/connz")
                ours = named(connz, "nicfleet-aggregator")
                assert ours, "the aggregator's connection is listed"
                assert len(named(connz, STALLED)) == 1
                assert (await monitor(api, "/varz"))["slow_consumers"] == 0

                noise = b"x" * 60_000
                for _ in range(200):  # ~12 MB the stalled reader never reads
                    await nc.publish(NOISE, noise)
                await nc.flush()

                async def cut() -> bool:
                    varz = await monitor(api, "/varz")
                    gone = not named(await monitor(api, "/connz"), STALLED)
                    return bool(varz["slow_consumers"] >= 1 and gone)

                await wait_until(cut, timeout=20, what="the stalled reader disconnected")
                closed = await monitor(api, "/connz?state=closed")
                reasons = [c.get("reason", "") for c in closed.get("connections") or ()
                           if c.get("name") == STALLED]  # fmt: skip
                assert reasons and reasons[0].startswith("Slow Consumer"), reasons

                # Ingest went on: a fault on the node is raised and published.
                port_down(root, "mlx5_0", 1)
                msg = await healthy.next_msg(timeout=15)
                assert msg.subject == f"nicfleet.v1.alert.critical.port-down.{node}"
                published = running.publish_stats.published
            # The agent has stopped (its connection drained): every counter batch it
            # published, before, during and after the episode, was applied.
            await wait_until(
                lambda: ingested(agg, "counters") == published.get(subjects.COUNTERS, 0),
                what="every counter batch applied",
            )
            assert agg.readiness() == (True, "ok")
            connz = await monitor(api, "/connz")
            assert named(connz, "nicfleet-aggregator") == ours  # not cut, not reconnected
            assert named(connz, STALLED) == set()
            kv = await nc.jetstream().key_value(subjects.KV_NODES)
            assert (await kv.get(subjects.node_token(node))).value
    finally:
        await nc.close()
        stalled.close()
