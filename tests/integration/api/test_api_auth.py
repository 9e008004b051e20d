"""Bearer-token authentication on a real aiohttp API server (127.0.0.1, ephemeral port)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth, parse_token_file
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService, AggregatorSettings
from tests.support.api_fixtures import STALE_AFTER, FakeClock, Readiness, sample_fleet

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
READ = "read-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
TOKENS = f"# test tokens\nread {READ}\nadmin {ADMIN}\n"


def app_with(auth: ApiAuth | None) -> web.Application:
    return build_app(
        fleet=sample_fleet(),
        settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=Readiness(),
        clock=FakeClock(),
        metrics=CollectorRegistry(),
        auth=auth,
    )


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    auth = parse_token_file(TOKENS, source="tokens")
    async with TestClient(TestServer(app_with(auth), host="127.0.0.1")) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def error_of(response: ClientResponse, status: int) -> dict[str, object]:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert isinstance(body, dict) and set(body) == {"error"}
    error = body["error"]
    assert isinstance(error, dict)
    return error


async def test_no_token_is_401_with_challenge(client: Client) -> None:
    response = await client.get("/api/v1/nodes")
    error = await error_of(response, 401)
    assert error["code"] == "unauthorized"
    assert "Bearer" in str(error["message"])
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {READ}x",
        f"Bearer {READ[:-1]}",
        "Bearer " + "z" * 4096,
        f"Basic {READ}",
        f"{READ}",
        "Bearer",
    ],
    ids=["suffix", "prefix", "huge", "basic-scheme", "no-scheme", "empty"],
)
async def test_wrong_token_is_401(client: Client, header: str) -> None:
    response = await client.get("/api/v1/nodes", headers={"Authorization": header})
    error = await error_of(response, 401)
    assert error["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_read_token_reads_every_get_route(client: Client) -> None:
    for path in ("/api/v1/nodes", "/api/v1/nodes/gpu-001", "/api/v1/policy", "/metrics"):
        response = await client.get(path, headers=bearer(READ))
        assert response.status == 200, (path, await response.text())
    body = await (await client.get("/api/v1/nodes", headers=bearer(READ))).json()
    assert body["total"] == 5


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_read_token_on_a_non_get_method_is_403(client: Client, method: str) -> None:
    response = await client.request(method, "/api/v1/nodes", headers=bearer(READ))
    error = await error_of(response, 403)
    assert error["code"] == "forbidden"
    assert "admin" in str(error["message"])


async def test_admin_token_passes_to_the_route(client: Client) -> None:
    assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).status == 200
    # No admin routes exist yet: past authentication, a POST meets the ordinary 405.
    response = await client.post("/api/v1/nodes", headers=bearer(ADMIN))
    assert (await error_of(response, 405))["code"] == "method_not_allowed"


async def test_unknown_route_needs_a_token_first(client: Client) -> None:
    assert (await client.get("/api/v1/nope")).status == 401
    response = await client.get("/api/v1/nope", headers=bearer(READ))
    assert (await error_of(response, 404))["code"] == "not_found"


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_probes_are_open(client: Client, path: str) -> None:
    assert (await client.get(path)).status == 200


async def test_metrics_needs_a_token_unless_public() -> None:
    auth = parse_token_file(TOKENS, source="tokens")
    async with TestClient(TestServer(app_with(auth), host="127.0.0.1")) as c:
        assert (await c.get("/metrics")).status == 401
    public = parse_token_file(TOKENS, source="tokens", metrics_public=True)
    async with TestClient(TestServer(app_with(public), host="127.0.0.1")) as c:
        response = await c.get("/metrics")
        assert response.status == 200
        assert "nicfleet_api_requests" in await response.text()
        assert (await c.get("/api/v1/nodes")).status == 401


async def test_refusals_are_counted(client: Client) -> None:
    await client.get("/api/v1/nodes")
    await client.post("/api/v1/nodes", headers=bearer(READ))
    text = await (await client.get("/metrics", headers=bearer(READ))).text()
    assert 'method="GET",route="/api/v1/nodes",status="401"' in text
    # POST has no route here (it would be a 405), hence "unmatched".
    assert 'method="POST",route="unmatched",status="403"' in text


async def test_no_auth_configured_keeps_the_api_open() -> None:
    async with TestClient(TestServer(app_with(None), host="127.0.0.1")) as c:
        assert (await c.get("/api/v1/nodes")).status == 200
        assert (await c.get("/metrics")).status == 200


async def test_tokens_never_logged_and_server_keeps_serving(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-token-0123456789abcdef"
    await client.get("/api/v1/nodes", headers=bearer(wrong))
    await client.get("/api/v1/nodes", headers=bearer(READ))
    await client.delete("/api/v1/nodes/gpu-001", headers=bearer(READ))
    await client.get("/api/v1/nodes", headers={"Authorization": "Bearer " + "q" * 20 + "!"})
    await client.get("/api/v1/nodes", headers=bearer(ADMIN))
    refusals = [r for r in caplog.records if r.name == "aggregator.api.auth"]
    assert len(refusals) == 3
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    for secret in (READ, ADMIN, wrong):
        assert secret not in logged
    # Still serving after every refusal.
    response = await client.get("/api/v1/nodes/gpu-002", headers=bearer(READ))
    assert response.status == 200
    assert (await response.json())["summary"]["name"] == "gpu-002"


async def test_aggregator_service_serves_with_auth(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The real service wiring: settings.api_auth reaches the served API."""
    caplog.set_level(logging.DEBUG)
    auth = parse_token_file(TOKENS, source="tokens")
    service = AggregatorService(
        AggregatorSettings(
            nats_url=nats_server.url, listen_port=0, api_auth=auth, identity="auth-test"
        )
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            await asyncio.wait_for(service.ready.wait(), 15)
            async with httpx.AsyncClient(base_url=service.api_url or "") as http:
                assert (await http.get("/healthz")).status_code == 200
                assert (await http.get("/metrics")).status_code == 401
                refused = await http.get("/api/v1/nodes")
                assert refused.status_code == 401
                assert refused.json()["error"]["code"] == "unauthorized"
                ok = await http.get("/api/v1/nodes", headers=bearer(READ))
                assert ok.status_code == 200, ok.text
                assert (await http.post("/api/v1/nodes", headers=bearer(READ))).status_code == 403
        finally:
            stop.set()
    assert READ not in caplog.text and ADMIN not in caplog.text
