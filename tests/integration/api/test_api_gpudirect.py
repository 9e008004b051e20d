"""The node detail's `gpudirect`: computed by the aggregator from the node's snapshot with
the tuned-host rules' definitions (aggregator.rules.gpudirect), on real lab snapshots read
with --proc-root: the demo's tuned host can use both paths, the untuned one none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.support.api_fixtures import NOW, Harness, sample_fleet
from tests.support.gpudirectlab import TUNED, UNTUNED, kernel_facts_fleet

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with TestClient(TestServer(Harness(fleet=kernel_facts_fleet(tmp_path, NOW)).app())) as c:
        yield c


async def _gpudirect(client: Client, node: str) -> dict[str, object]:
    response = await client.get(f"/api/v1/nodes/{node}")
    assert response.status == 200
    body = await response.json()
    assert isinstance(body["gpudirect"], dict)
    return body["gpudirect"]


async def test_tuned_host_has_both_paths(client: Client) -> None:
    gd = await _gpudirect(client, TUNED)
    assert (gd["path"], gd["paths"]) == ("both", ["dma-buf", "peermem"])
    assert gd["path_reason"] == (
        "dma-buf: open NVIDIA kernel modules on Linux 6.8.0-45-generic; "
        "peermem: nvidia_peermem loaded."
    )
    assert (gd["nvidia_kernel_module"], gd["kernel_release"]) == ("open", "6.8.0-45-generic")
    assert gd["iommu"] == "off"


async def test_untuned_host_has_none_and_says_why(client: Client) -> None:
    gd = await _gpudirect(client, UNTUNED)
    assert (gd["path"], gd["paths"]) == ("none", [])
    assert "not with the proprietary NVIDIA kernel modules" in str(gd["path_reason"])
    assert "nvidia_peermem not loaded" in str(gd["path_reason"])


async def test_without_kernel_facts_unknown_and_without_snapshot_absent() -> None:
    async with TestClient(TestServer(Harness(fleet=sample_fleet()).app())) as client:
        body = await (await client.get("/api/v1/nodes/gpu-010")).json()
        assert body["gpudirect"] is None  # no snapshot yet
        gd = (await (await client.get("/api/v1/nodes/gpu-001")).json())["gpudirect"]
        assert gd["path"] == "none"  # a snapshot without the NVIDIA driver
        assert gd["path_reason"].startswith("dma-buf: no NVIDIA kernel module loaded")
