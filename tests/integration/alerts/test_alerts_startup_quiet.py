"""A start stays quiet (issue 21): an aggregator that hears a node before its inventory
(a counter batch first, as after any aggregator start) fires nothing for it — before,
every node got a `data-quality` "no inventory snapshot received yet" warning that fired
and resolved within a second. Real nats-server, `python -m aggregator run`, real agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest

from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import encode
from proto.messages.counters import CounterBatch
from tests.integration.agent.test_pipeline import lab_node
from tests.integration.faults.test_faults_aggregator import evaluations
from tests.support.faults import AggregatorProcess, add_alert_recorder, recorded_alerts
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = ("start-01", "start-02")
EARLY = NODES[0]  # heard (a counter batch) well before its agent sends the snapshot


@contextlib.asynccontextmanager
async def _agents(nats_url: str, roots: list[Path]) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        for node, root in zip(NODES, roots, strict=True):
            settings = AgentSettings(node_name=node, sysfs_root=root, nats_url=nats_url,
                                     counter_interval=1.0, netlink=False)  # fmt: skip
            tasks.create_task(AgentService(settings).run(stop))
        try:
            yield
        finally:
            stop.set()


async def _evaluations(api: httpx.AsyncClient) -> float:
    return evaluations((await api.get("/metrics")).text)


async def _evaluated_again(api: httpx.AsyncClient, times: int) -> None:
    base = await _evaluations(api)

    async def done() -> bool:
        return await _evaluations(api) >= base + times

    await wait_until(done, timeout=30, what=f"{times} more evaluations")


async def _states(api: httpx.AsyncClient) -> dict[str, str]:
    states: dict[str, str] = {}
    for node in NODES:
        reply = await api.get(f"/api/v1/nodes/{node}")
        if reply.status_code == 200:
            states[node] = str(reply.json()["summary"]["state"])
    return states


async def test_first_contact_before_the_snapshot_fires_nothing(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    roots = [lab_node(tmp_path, "a100-ib-4nic", node) for node in NODES]
    nc = await nats.connect(own_nats.url)
    proc = AggregatorProcess(own_nats.url, tmp_path, "aggregator")
    try:
        await add_alert_recorder(nc)
        proc.start()
        await wait_until(proc.is_ready, timeout=30, what="aggregator ready")
        async with httpx.AsyncClient(base_url=proc.api_url) as api:
            batch = CounterBatch(node=EARLY, seq=1, collected_at=time.time(), interval_s=1.0)
            await nc.publish(subjects.node_subject(EARLY, subjects.COUNTERS), encode(batch))
            await nc.flush()

            async def heard_early() -> bool:
                return (await _states(api)).get(EARLY) == "no-snapshot"

            await wait_until(heard_early, timeout=30, what=f"{EARLY} known without a snapshot")
            await _evaluated_again(api, 3)  # before: data-quality fired here
            findings = (await api.get("/api/v1/findings")).json()
            assert [f for f in findings["items"] if f["node"] == EARLY] == []
            async with _agents(own_nats.url, roots):

                async def ready() -> bool:
                    return await _states(api) == dict.fromkeys(NODES, "ready")

                await wait_until(ready, timeout=30, what="every node ready")
                await _evaluated_again(api, 3)
            await nc.flush()
            # Two healthy, identical lab nodes: nothing to alert, and nothing was.
            assert [(a.rule, a.node, a.subject, a.state) for a in await recorded_alerts(nc)] == []
    finally:
        await asyncio.to_thread(proc.stop)
        await nc.close()
