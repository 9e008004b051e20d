"""/api/v1/resources and /api/v1/trace on a real aiohttp server (127.0.0.1)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from aggregator.trace.chain import LINK_NAMES
from tests.support.api_fixtures import Harness, sample_fleet
from tests.support.builders import rdma_policy
from tests.support.chain_fixtures import RES, ChainHarness, chain_cluster

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]


@pytest.fixture
def harness() -> ChainHarness:
    return ChainHarness()


@pytest.fixture
async def client(harness: ChainHarness) -> AsyncIterator[Client]:
    async with TestClient(TestServer(harness.app(), host="127.0.0.1")) as c:
        yield c


async def get_json(client: Client, path: str, status: int = 200) -> dict[str, object]:
    response = await client.get(path)
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def test_trace_healthy_without_cluster(client: Client) -> None:
    body = await get_json(client, f"/api/v1/trace?node=gpu-001&resource={RES}")
    assert (body["node"], body["resource"], body["ok"], body["first_broken"]) == (
        "gpu-001",
        RES,
        False,  # ok only when every link is: without a cluster, several are not judged
        None,
    )
    assert body["verdict"] == "unknown"
    assert str(body["verdict_reason"]).startswith("8 links not judged (components, allocatable,")
    links = body["links"]
    assert isinstance(links, list)
    assert [link["name"] for link in links] == list(LINK_NAMES)
    assert links[7] == {
        "name": "allocatable",
        "status": "unknown",
        "evidence": {"cluster": "no cluster"},
        "cause": None,
        "fix": None,
    }


async def test_trace_broken_link_with_cause_and_fix(client: Client) -> None:
    body = await get_json(client, f"/api/v1/trace?node=gpu-002&resource={RES}")
    assert body["ok"] is False
    assert body["first_broken"] == 3
    links = body["links"]
    assert isinstance(links, list)
    broken = links[3]
    assert broken["name"] == "rdma-device"
    assert broken["status"] == "broken"
    assert "no active port" in broken["cause"]
    assert "mlxlink" in broken["fix"]


async def test_trace_follows_live_cluster_and_policy_sources(
    client: Client, harness: ChainHarness
) -> None:
    harness.cluster = chain_cluster()
    body = await get_json(client, f"/api/v1/trace?node=gpu-001&resource={RES}")
    assert (body["verdict"], body["ok"]) == ("unknown", False)  # never validated
    assert body["verdict_reason"] == (
        "2 links not judged (pod-interface, tested-data-path); nothing broken"
    )
    links = body["links"]
    assert isinstance(links, list)
    assert links[7]["evidence"]["allocatable"] == "2"
    assert links[8]["evidence"]["running"] == 1
    harness.policies = (rdma_policy("a", RES), rdma_policy("b", RES))
    body = await get_json(client, f"/api/v1/trace?node=gpu-001&resource={RES}")
    assert body["first_broken"] == 5


async def test_trace_unknown_node_suggests(client: Client) -> None:
    body = await get_json(client, f"/api/v1/trace?node=gpu-01&resource={RES}", 404)
    error = body["error"]
    assert isinstance(error, dict)
    assert error["code"] == "not_found"
    assert error["field"] == "node"
    assert error["message"] == "node 'gpu-01' not found"
    assert error["suggestions"][0] in ("gpu-001", "gpu-002")


async def test_trace_unknown_resource_suggests(client: Client) -> None:
    body = await get_json(client, "/api/v1/trace?node=gpu-001&resource=rdma/ibb", 404)
    assert body["error"] == {
        "code": "not_found",
        "message": "resource 'rdma/ibb' is neither configured nor served on 'gpu-001'; "
        "known here: rdma/ib",
        "field": "resource",
        "suggestions": ["rdma/ib"],
    }


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        pytest.param("resource=rdma/ib", "node", "'node' is required", id="no-node"),
        pytest.param("node=gpu-001", "resource", "'resource' is required", id="no-resource"),
        pytest.param("", "node", "'node' is required", id="nothing"),
        pytest.param("node=&resource=rdma/ib", "node", "is empty", id="empty-node"),
        pytest.param("node=GPU_1&resource=rdma/ib", "node", "GPU_1", id="invalid-node"),
        pytest.param("node=gpu-001&resource=ib", "resource", "full resource name", id="bare"),
        pytest.param(
            "node=gpu-001&resource=rdma/a%20b", "resource", "'rdma/a b'", id="space-in-resource"
        ),
        pytest.param(
            "node=gpu-001&resource=rdma/ib&resource=rdma/x", "resource", "more than once", id="dup"
        ),
        pytest.param("node=gpu-001&resource=rdma/ib&x=1", "x", "unknown query", id="unknown"),
        pytest.param(
            "node=gpu-001&resource=rdma/" + "a" * 400, "resource", "full resource", id="too-long"
        ),
    ],
)
async def test_trace_bad_parameters_are_400_and_serving_goes_on(
    client: Client, query: str, field: str, message: str
) -> None:
    body = await get_json(client, f"/api/v1/trace?{query}", 400)
    error = body["error"]
    assert isinstance(error, dict)
    assert (error["code"], error["field"]) == ("bad_request", field)
    assert message in error["message"]
    answer = await get_json(client, f"/api/v1/trace?node=gpu-001&resource={RES}")
    assert answer["first_broken"] is None


async def test_resources_list(client: Client) -> None:
    body = await get_json(client, "/api/v1/resources")
    assert body["count"] == 1
    items = body["items"]
    assert isinstance(items, list)
    ib = items[0]
    assert ib["name"] == RES
    assert (ib["nodes_selected"], ib["nodes_advertising"], ib["capacity"], ib["healthy"]) == (
        2,
        2,
        4,
        2,
    )
    assert ib["allocatable"] is None
    assert [n["node"] for n in ib["nodes"]] == ["gpu-001", "gpu-002"]


async def test_resources_filters(client: Client, harness: ChainHarness) -> None:
    harness.cluster = chain_cluster()
    body = await get_json(client, f"/api/v1/resources?node=gpu-002&name={RES}")
    items = body["items"]
    assert isinstance(items, list)
    assert [n["node"] for n in items[0]["nodes"]] == ["gpu-002"]
    assert items[0]["allocatable"] == 2
    assert (await get_json(client, "/api/v1/resources?name=rdma/none"))["count"] == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("node=Not_A_Node", "node"),
        ("name=nope", "name"),
        ("node=a&node=b", "node"),
        ("limit=3", "limit"),
        ("name=", "name"),
    ],
)
async def test_resources_bad_parameters(client: Client, query: str, field: str) -> None:
    body = await get_json(client, f"/api/v1/resources?{query}", 400)
    assert body["error"]["field"] == field  # type: ignore[index]
    assert (await get_json(client, "/api/v1/resources"))["count"] == 1


async def test_default_wiring_has_no_cluster_and_no_policies() -> None:
    # The plain build_app (no sources passed) serves the routes too: the sample fleet has no
    # device-plugin status, so it knows no resources.
    async with TestClient(TestServer(Harness(fleet=sample_fleet()).app(), host="127.0.0.1")) as c:
        assert await get_json(c, "/api/v1/resources") == {"items": [], "count": 0}
        body = await get_json(c, f"/api/v1/trace?node=gpu-001&resource={RES}", 404)
        assert body["error"]["field"] == "resource"  # type: ignore[index]
        assert "suggestions" not in body["error"]  # type: ignore[operator]


async def test_chain_routes_are_counted_by_route_template(client: Client) -> None:
    await get_json(client, "/api/v1/trace?node=x", 400)
    text = await (await client.get("/metrics")).text()
    assert 'route="/api/v1/trace",status="400"' in text
