"""GET /api/v1/trace/pods/{namespace}/{name} on a real aiohttp server (127.0.0.1): one
pod's own chain."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from aggregator.trace.chain import LINK_NAMES
from tests.support.chain_fixtures import ChainHarness
from tests.support.pod_trace_fixtures import pod_cluster

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = ChainHarness(cluster=pod_cluster()).app()
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        yield c


async def get(client: Client, pod: str, status: int) -> dict[str, object]:
    response = await client.get(f"/api/v1/trace/pods/{pod}")
    assert response.status == status, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def test_a_scheduled_pods_chain(client: Client) -> None:
    body = await get(client, "ml/t-0", 200)
    assert (body["namespace"], body["name"], body["node"], body["ok"]) == (
        "ml", "t-0", "gpu-001", True,
    )  # fmt: skip
    traces = body["traces"]
    assert isinstance(traces, list) and len(traces) == 1
    assert [link["name"] for link in traces[0]["links"]] == list(LINK_NAMES)
    assert traces[0]["components"]["status"] == "ok"


async def test_a_pending_pod_says_why_it_is_not_scheduled(client: Client) -> None:
    body = await get(client, "ml/t-9", 200)
    assert (body["node"], body["ok"], body["traces"]) == (None, False, [])
    scheduling = body["scheduling"]
    assert isinstance(scheduling, dict)
    assert scheduling["cause"] == (
        "ml/t-9 is not scheduled: 0/2 nodes are available: 2 Insufficient rdma/ib"
    )


async def test_an_unknown_pod_is_404_with_its_name(client: Client) -> None:
    error = (await get(client, "ml/t-00", 404))["error"]
    assert isinstance(error, dict)
    assert (error["code"], error["field"]) == ("not_found", "name")
    assert error["suggestions"][0] == "ml/t-0"
    assert "pod 'ml/t-00' not found" in error["message"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        pytest.param("ML/t-0", 400, id="namespace-not-a-label"),
        pytest.param("ml/T_0", 400, id="not-a-pod-name"),
        pytest.param("ml/t-0?node=gpu-001", 400, id="a-query"),
        pytest.param("ml", 404, id="no-name"),
    ],
)
async def test_bad_pod_paths(client: Client, path: str, status: int) -> None:
    await get(client, path, status)
