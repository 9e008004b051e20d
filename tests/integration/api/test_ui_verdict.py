"""The status page's trace verdict in a real headless chromium (tests/support/cdp.py) against
the real API on the chain fixtures: "Every link holds." only when the API's verdict is ok;
degraded names the adapters, unknown the links not judged, broken the first broken link.
The words are the API's `verdict` and `verdict_reason`, so page, CLI and API agree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import msgspec
import pytest
from aiohttp import web

from aggregator.api.statuspage import add_ui_routes
from aggregator.cluster import ClusterNode
from tests.integration.api.test_ui import needs_chromium, no_page_errors
from tests.integration.ctl.test_ctl_chain import verified
from tests.support.builders import T0, modules, nic, plugin_status, resource_status, snapshot
from tests.support.cdp import open_page
from tests.support.chain_fixtures import RES, ChainHarness, chain_cluster, chain_fleet

pytestmark = pytest.mark.integration

DEGRADED = "gpu-003"  # mlx5_1's port down: one of two adapters serves rdma/ib


def harness() -> ChainHarness:
    fleet = chain_fleet()
    devices = tuple(
        msgspec.structs.replace(
            nic(f"mlx5_{i}", index=i, netdevs=(f"ib{i}",), state="DOWN" if i else "ACTIVE"),
            fw_ver="28.39.1002",
        )
        for i in range(2)
    )
    fleet.apply_snapshot(
        msgspec.structs.replace(snapshot(DEGRADED, devices=devices), modules=modules()), T0
    )
    unhealthy = {"mlx5_1": "no port ACTIVE/LinkUp (1:DOWN/Disabled)"}
    served = resource_status(RES, devices=("mlx5_0", "mlx5_1"), unhealthy=unhealthy)
    fleet.apply_status(plugin_status(DEGRADED, served), T0)
    cluster = chain_cluster()
    nodes = {**cluster.nodes, DEGRADED: ClusterNode(name=DEGRADED, allocatable={RES: "2"})}
    return ChainHarness(
        fleet=fleet,
        cluster=msgspec.structs.replace(cluster, nodes=nodes),
        validations={"gpu-001": verified(found=True)},
    )


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    add_ui_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@needs_chromium
async def test_the_verdict_line_says_what_the_api_says(tmp_path: Path) -> None:
    chain = harness()
    async with served(chain.app()) as base, open_page(tmp_path / "browser") as page:
        await page.goto(f"{base}/ui/")

        async def shown(node: str) -> tuple[str, str, str]:
            await page.evaluate(f"window.location.hash = '#/trace/{node}/rdma%2Fib'")
            await page.wait_for(
                f"document.querySelector('h1')?.textContent.includes('{node}') && "
                "!!document.querySelector('#verdict')",
                what=f"the trace of {node}",
            )
            value: list[str] = await page.evaluate(
                "(v => [v.dataset.verdict, v.className, v.textContent])"
                "(document.querySelector('#verdict'))"
            )
            return value[0], value[1], value[2]

        async with httpx.AsyncClient(base_url=base) as http:
            api = (
                await http.get("/api/v1/trace", params={"node": DEGRADED, "resource": RES})
            ).json()
        assert await shown("gpu-001") == ("ok", "ok", "Every link holds.")
        assert await shown(DEGRADED) == (
            "degraded", "warning", f"Degraded: {api['verdict_reason']}."
        )  # fmt: skip
        assert api["verdict_reason"] == "capacity reduced on mlx5_1 (rdma-device, advertised)"
        assert await shown("gpu-002") == ("broken", "bad", "Broken at link 3: rdma-device.")
        chain.validations.clear()  # never validated: the last two links cannot be judged
        assert await shown("gpu-001") == (
            "unknown",
            "unknown",
            "Unknown: 2 links not judged (pod-interface, tested-data-path); nothing broken.",
        )
        statuses = await page.evaluate(
            "[...document.querySelectorAll('#chain li[data-link]')].map(li => li.className)"
        )
        assert "link unknown" in statuses and "link ok" in statuses
        await no_page_errors(page)
