"""The aggregator HTTP API on a real aiohttp server (127.0.0.1, ephemeral port)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api_fixtures import NOW, STALE_AFTER, Harness, sample_fleet
from tests.support.builders import T0, port_event

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
ALL_NODES = ["gpu-001", "gpu-002", "gpu-003", "gpu-010", "roce-01"]


@pytest.fixture
def harness() -> Harness:
    return Harness(fleet=sample_fleet())


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[Client]:
    async with TestClient(TestServer(harness.app(), host="127.0.0.1")) as c:
        yield c


async def get_json(client: Client, path: str, status: int = 200) -> object:
    response = await client.get(path)
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    return await response.json()


async def test_healthz(client: Client) -> None:
    assert await get_json(client, "/healthz") == {"status": "ok"}


async def test_readyz_follows_readiness(client: Client, harness: Harness) -> None:
    assert await get_json(client, "/readyz") == {"status": "ready", "reason": "ok"}
    harness.readiness.ready, harness.readiness.reason = False, "not connected to NATS"
    body = await get_json(client, "/readyz", 503)
    assert body == {"error": {"code": "not_ready", "message": "not connected to NATS"}}


async def test_unexpected_exception_is_a_json_500(client: Client, harness: Harness) -> None:
    harness.readiness.error = RuntimeError("boom")
    body = await get_json(client, "/readyz", 500)
    assert body == {"error": {"code": "internal", "message": "internal server error"}}
    harness.readiness.error = None
    assert await get_json(client, "/healthz") == {"status": "ok"}


async def test_list_nodes_sorted_with_summaries(client: Client) -> None:
    body = await get_json(client, "/api/v1/nodes")
    assert isinstance(body, dict)
    assert [i["name"] for i in body["items"]] == ALL_NODES
    assert (body["count"], body["total"], body["offset"], body["limit"]) == (5, 5, 0, 500)
    assert "continue" not in body  # one page holds them all
    by_name = {i["name"]: i for i in body["items"]}
    assert {n: i["state"] for n, i in by_name.items()} == {
        "gpu-001": "ready", "gpu-002": "ready", "gpu-003": "stale",
        "gpu-010": "no-snapshot", "roce-01": "ready",
    }  # fmt: skip
    gpu2 = by_name["gpu-002"]
    assert gpu2["ports_down"] == ["mlx5_1/1"]
    assert (gpu2["ports_active"], gpu2["ports_total"], gpu2["devices"], gpu2["gpus"]) == (
        1,
        2,
        2,
        8,
    )
    assert gpu2["link_layers"] == ["InfiniBand"]
    assert gpu2["max_rate_gbps"] == 400.0
    assert gpu2["firmware"] == ["28.39.1002"]
    assert gpu2["age_s"] == pytest.approx(NOW - (T0 + 2.5))
    assert by_name["roce-01"]["link_layers"] == ["Ethernet"]


@pytest.mark.parametrize(
    ("query", "names", "total"),
    [
        pytest.param("state=ready", ["gpu-001", "gpu-002", "roce-01"], 3, id="ready"),
        pytest.param("state=stale", ["gpu-003"], 1, id="stale"),
        pytest.param("state=no-snapshot", ["gpu-010"], 1, id="no-snapshot"),
        pytest.param("limit=2", ALL_NODES[:2], 5, id="limit"),
        pytest.param("limit=2&offset=3", ALL_NODES[3:], 5, id="last-page"),
        pytest.param("offset=10", [], 5, id="past-the-end"),
        pytest.param("state=ready&limit=1&offset=1", ["gpu-002"], 3, id="filter-then-page"),
    ],
)
async def test_list_nodes_filters_and_pages(
    client: Client, query: str, names: list[str], total: int
) -> None:
    body = await get_json(client, f"/api/v1/nodes?{query}")
    assert isinstance(body, dict)
    assert [i["name"] for i in body["items"]] == names
    assert (body["count"], body["total"]) == (len(names), total)


async def test_staleness_follows_the_clock(client: Client, harness: Harness) -> None:
    harness.clock.now = T0 + 4 + STALE_AFTER + 1
    body = await get_json(client, "/api/v1/nodes?state=ready")
    assert isinstance(body, dict)
    assert body["items"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param("state=bogus", "state", id="bad-state"),
        pytest.param("state=", "state", id="empty-state"),
        pytest.param("limit=-1", "limit", id="negative"),
        pytest.param("limit=0", "limit", id="zero"),
        pytest.param("limit=5001", "limit", id="over-the-maximum"),
        pytest.param("limit=abc", "limit", id="not-a-number"),
        pytest.param("limit=1.5", "limit", id="fraction"),
        pytest.param("limit=%201", "limit", id="leading-space"),
        pytest.param("limit=99999999999", "limit", id="huge"),
        pytest.param("offset=x", "offset", id="bad-offset"),
        pytest.param("limit=1&limit=2", "limit", id="repeated"),
        pytest.param("stat=ready", "stat", id="unknown-param"),
    ],
)
async def test_bad_query_parameters_are_400_naming_the_field(
    client: Client, query: str, field: str
) -> None:
    body = await get_json(client, f"/api/v1/nodes?{query}", 400)
    assert isinstance(body, dict)
    assert body["error"]["code"] == "bad_request"
    assert body["error"]["field"] == field
    assert field in body["error"]["message"]


async def test_node_detail(client: Client) -> None:
    body = await get_json(client, "/api/v1/nodes/gpu-001")
    assert isinstance(body, dict)
    assert body["summary"]["name"] == "gpu-001"
    assert body["summary"]["state"] == "ready"
    assert body["snapshot"]["schema"] == "nicfleet.v1.NodeSnapshot"
    assert [a["name"] for a in body["snapshot"]["devices"]] == ["mlx5_0", "mlx5_1"]
    assert body["counters"]["ports"][0]["counters"] == {"port_rcv_data": 1234}
    assert (body["first_seen"], body["snapshot_received_at"], body["counters_received_at"]) == (
        T0, T0, T0 + 1,
    )  # fmt: skip
    assert body["events"] == []


async def test_node_detail_shows_live_port_state_and_event_latency(
    client: Client, harness: Harness
) -> None:
    harness.fleet.apply_event(port_event("gpu-001", observed_at=T0 + 3, seq=7), T0 + 3.04)
    body = await get_json(client, "/api/v1/nodes/gpu-001")
    assert isinstance(body, dict)
    port = body["snapshot"]["devices"][0]["ports"][0]
    assert (port["state"], port["phys_state"], port["state_id"]) == ("DOWN", "Disabled", 1)
    (event,) = body["events"]
    assert event["seq"] == 7
    assert (event["kind"], event["device"], event["port"]) == ("port-state", "mlx5_0", 1)
    assert (event["old_state"], event["new_state"]) == ("ACTIVE", "DOWN")
    assert (event["observed_at"], event["received_at"]) == (T0 + 3, T0 + 3.04)
    assert event["latency_ms"] == pytest.approx(40.0)
    assert body["summary"]["ports_down"] == ["mlx5_0/1"]


async def test_node_without_snapshot(client: Client) -> None:
    body = await get_json(client, "/api/v1/nodes/gpu-010")
    assert isinstance(body, dict)
    assert body["snapshot"] is None
    assert body["summary"]["state"] == "no-snapshot"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("gpu-01", {"gpu-001", "gpu-010"}, id="typo"),
        pytest.param("roce-1", {"roce-01"}, id="one-match"),
        pytest.param("storage-7", set(), id="nothing-close"),
    ],
)
async def test_unknown_node_is_404_with_suggestions(
    client: Client, name: str, expected: set[str]
) -> None:
    body = await get_json(client, f"/api/v1/nodes/{name}", 404)
    assert isinstance(body, dict)
    error = body["error"]
    suggestions = error.get("suggestions", [])
    assert expected <= set(suggestions)
    assert len(suggestions) <= 3
    assert bool(suggestions) == bool(expected)  # omitted when there is nothing close
    assert {k: v for k, v in error.items() if k != "suggestions"} == {
        "code": "not_found",
        "message": f"node '{name}' not found",
        "field": "node",
    }


@pytest.mark.parametrize("name", ["GPU-001", "gpu_001", "-gpu", "a" * 254])
async def test_invalid_node_name_is_400(client: Client, name: str) -> None:
    body = await get_json(client, f"/api/v1/nodes/{name}", 400)
    assert isinstance(body, dict)
    assert (body["error"]["code"], body["error"]["field"]) == ("bad_request", "node")


async def test_unknown_route_is_json_404(client: Client) -> None:
    body = await get_json(client, "/api/v2/nothing", 404)
    assert body == {"error": {"code": "not_found", "message": "no route for GET /api/v2/nothing"}}


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/nodes/gpu-001", "/healthz"])
async def test_wrong_method_is_json_405(client: Client, path: str) -> None:
    response = await client.post(path, data=b"{}")
    assert response.status == 405
    assert "GET" in response.headers["Allow"]
    body = await response.json()
    assert body["error"]["code"] == "method_not_allowed"
    assert path in body["error"]["message"]


async def test_metrics_parse_and_count_requests_by_route(
    client: Client,
) -> None:
    await get_json(client, "/api/v1/nodes/gpu-001")
    await get_json(client, "/api/v1/nodes/gpu-002")
    await get_json(client, "/api/v1/nodes/nope", 404)
    await get_json(client, "/elsewhere", 404)
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    samples = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["nicfleet_api_requests"].samples
        if s.name == "nicfleet_api_requests_total"
    }
    assert samples[("/api/v1/nodes/{node}", "200")] == 2
    assert samples[("/api/v1/nodes/{node}", "404")] == 1
    assert samples[("unmatched", "404")] == 1


async def test_bad_requests_leave_state_unchanged_and_server_serving(
    client: Client, harness: Harness
) -> None:
    before = harness.fleet.records()
    listing = await get_json(client, "/api/v1/nodes")
    for path in ["/api/v1/nodes?limit=x", "/api/v1/nodes/BAD", "/api/v1/nodes/%00", "/x" * 300]:
        response = await client.get(path)
        assert 400 <= response.status < 500
        await response.read()
    await (await client.delete("/api/v1/nodes/gpu-001")).read()
    await (await client.put("/api/v1/nodes", data=b"garbage")).read()
    after = harness.fleet.records()
    assert len(after) == len(before)
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert await get_json(client, "/api/v1/nodes") == listing
