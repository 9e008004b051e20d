"""Issue 19 §3 end to end: a real agent whose clock runs 600 s ahead, then restarted (seq
back to 1) with a correct clock, over a real nats-server into the real AggregatorService —
the port-down of the new process shows at once, also when the aggregator restarted in
between and rebuilt its fleet from KV; the clock-skew finding names the offset and resolves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest

from agent.lab.faults import port_down
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import StoredNode
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from aggregator.service import AggregatorService
from proto import subjects
from proto.codec import decode
from tests.integration.agent.test_pipeline import aggregator, lab_node
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration]

AHEAD = 600.0


@asynccontextmanager
async def agent_on(url: str, root: Path, node: str, *, skew: float) -> AsyncIterator[int]:
    """A real agent process whose clock runs `skew` seconds off; yields its epoch."""
    settings = AgentSettings(node_name=node, sysfs_root=root, nats_url=url, counter_interval=0.2)
    service = AgentService(settings, clock=lambda: time.time() + skew)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield service.epoch
        finally:
            stop.set()


def held_epoch(agg: AggregatorService, node: str) -> int | None:
    record = agg.fleet.get(node)
    return None if record is None or record.snapshot is None else record.snapshot.epoch


def port_state(agg: AggregatorService, node: str) -> str | None:
    record = agg.fleet.get(node)
    if record is None or record.snapshot is None:
        return None
    device = next(d for d in record.snapshot.devices if d.name == "mlx5_0")
    return next(p.state for p in device.ports if p.port == 1)


def skew_findings(agg: AggregatorService) -> list[Finding]:
    return [f for f in evaluate(agg.fleet.view(), now=time.time()) if f.rule == "clock-skew"]


async def test_a_restart_after_a_clock_600s_ahead_shows_the_port_down_at_once(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "skew-restart-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    async with aggregator(own_nats.url) as agg:
        async with agent_on(own_nats.url, root, node, skew=AHEAD) as ahead:
            await wait_until(lambda: held_epoch(agg, node) == ahead, what="the skewed agent")
            await wait_until(lambda: bool(skew_findings(agg)), what="clock-skew finding")
            (finding,) = skew_findings(agg)
            offset = finding.evidence["offset_s"]
            assert isinstance(offset, float) and AHEAD - 2 < offset <= AHEAD
            assert finding.evidence["direction"] == "ahead"
        async with agent_on(own_nats.url, root, node, skew=0.0) as fixed:
            await wait_until(lambda: held_epoch(agg, node) == fixed, timeout=10,
                             what="the restarted agent's seq-1 snapshot")  # fmt: skip
            assert port_state(agg, node) == "ACTIVE"
            port_down(root, "mlx5_0", 1)
            await wait_until(lambda: port_state(agg, node) == "DOWN", timeout=10,
                             what="the port-down of the restarted agent")  # fmt: skip
            await wait_until(lambda: not skew_findings(agg), timeout=10, what="skew resolved")


async def test_the_restart_is_followed_after_an_aggregator_restart_from_kv(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "skew-restart-02"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    nc = await nats.connect(own_nats.url)
    try:
        async with (
            aggregator(own_nats.url) as first,
            agent_on(own_nats.url, root, node, skew=AHEAD) as ahead,
        ):
            await wait_until(lambda: held_epoch(first, node) == ahead, what="skewed agent")
            nodes = await nc.jetstream().key_value(subjects.KV_NODES)

            async def persisted() -> bool:
                try:
                    entry = await nodes.get(subjects.node_token(node))
                except nats.js.errors.KeyNotFoundError:
                    return False
                return decode(entry.value or b"", StoredNode).snapshot.epoch == ahead

            await wait_until(persisted, what="the skewed agent's snapshot in KV")
        # A new aggregator: all it knows is KV, which holds a snapshot stamped 600 s ahead.
        async with aggregator(own_nats.url) as second:
            await wait_until(lambda: held_epoch(second, node) == ahead, what="fleet from KV")
            async with agent_on(own_nats.url, root, node, skew=0.0) as fixed:
                await wait_until(lambda: held_epoch(second, node) == fixed, timeout=10,
                                 what="the restarted agent's seq-1 snapshot")  # fmt: skip
                port_down(root, "mlx5_0", 1)
                await wait_until(lambda: port_state(second, node) == "DOWN", timeout=10,
                                 what="the port-down of the restarted agent")  # fmt: skip
    finally:
        await nc.close()
