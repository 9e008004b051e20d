"""API bearer tokens checked by Kubernetes TokenReview: a real aiohttp API on 127.0.0.1 whose
reviews go through `KubeClient.review_token` (kubernetes.aio) to kmock's emulator, plus the
whole aggregator with `api_token_review` and nicfleetctl against it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import httpx
import kmock
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth, parse_token_file
from aggregator.api.tokenreview import ReviewSettings, TokenReviewer
from aggregator.bus.natsserver import NatsServer
from aggregator.cli.main import main as aggregator_cli
from aggregator.ctl.main import cli
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from tests.support.api_fixtures import STALE_AFTER, FakeClock, Readiness, sample_fleet

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
DEFAULTS = ReviewSettings()
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
# ServiceAccount-token-shaped secrets (JWT: three base64url parts).
ADMIN_SA = "eyJhbGciOiJSUzI1NiJ9.YWRtaW4tc2E.c2lnbmF0dXJlLWFkbWlu"
READ_SA = "eyJhbGciOiJSUzI1NiJ9.cmVhZC1zYQ.c2lnbmF0dXJlLXJlYWQ"
STRANGER = "eyJhbGciOiJSUzI1NiJ9.c3RyYW5nZXI.c2lnbmF0dXJlLXN0cmFuZ2Vy"
EXPIRED = "eyJhbGciOiJSUzI1NiJ9.ZXhwaXJlZA.c2lnbmF0dXJlLWV4cGlyZWQ"
FILE_READ = "file-read-token-0123456789"
SECRETS = (ADMIN_SA, READ_SA, STRANGER, EXPIRED, FILE_READ)
USERS: dict[str, dict[str, Any]] = {
    ADMIN_SA: {
        "username": "system:serviceaccount:ops:nicfleet-admin",
        "groups": ["system:serviceaccounts", "nicfleet:admins"],
    },
    READ_SA: {"username": "alice", "groups": ["system:authenticated", "nicfleet:readers"]},
    STRANGER: {"username": "bob", "groups": ["system:authenticated"]},
}


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator, except that TokenReviews are answered and never stored, as a real
    API server does (the emulator stores every create and would answer the second 409)."""

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.resource.plural == "tokenreviews":
            return await kmock.KubernetesScaffold._handle(self, request)
        return await super()._handle(request)


@dataclass
class Reviews:
    """The API server's token authenticator: USERS are valid, anything else is not."""

    status: int = 201  # anything else: the API server answers this error
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: kmock.Request) -> kmock.Response:
        self.requests.append(request.data)
        if self.status != 201:
            message = f"tokenreviews.authentication.k8s.io failed ({self.status})"
            failure = {"kind": "Status", "code": self.status, "message": message}
            return kmock.Response(status=self.status, payload=failure)
        spec = request.data["spec"]
        user = USERS.get(spec["token"])
        status: dict[str, Any] = (
            {"authenticated": True, "user": user, "audiences": spec.get("audiences", [])}
            if user is not None
            else {"authenticated": False, "error": "invalid bearer token"}
        )
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview"}
        return kmock.Response(status=201, payload={**review, "spec": spec, "status": status})

    def tokens(self) -> list[str]:
        return [body["spec"]["token"] for body in self.requests]


@pytest.fixture
def reviews() -> Reviews:
    return Reviews()


@pytest.fixture
async def apiserver(reviews: Reviews) -> AsyncIterator[ApiServer]:
    emu = ApiServer()
    emu["post", TOKENREVIEWS] << reviews
    for resource, kind, namespaced in (
        ("v1/nodes", "Node", False),
        ("v1/pods", "Pod", True),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
        ("nicfleet.io/v1alpha1/nicfleetpolicies", "NicFleetPolicy", False),
        ("mellanox.com/v1alpha1/nicclusterpolicies", "NicClusterPolicy", False),
    ):
        emu.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    async with emu:
        yield emu


@asynccontextmanager
async def api(
    apiserver: ApiServer,
    settings: ReviewSettings = DEFAULTS,
    *,
    auth: ApiAuth | None = None,
) -> AsyncIterator[tuple[Client, TokenReviewer, CollectorRegistry]]:
    async with kmock.Server(apiserver) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url), request_timeout_s=5))
        async with kube:
            reviewer = TokenReviewer(kube.review_token, settings, clock=time.monotonic)
            registry = CollectorRegistry()
            app = build_app(
                fleet=sample_fleet(),
                settings=ApiSettings(stale_after=STALE_AFTER),
                readiness=Readiness(),
                clock=FakeClock(),
                metrics=registry,
                auth=auth,
                token_review=reviewer,
            )
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                yield client, reviewer, registry


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def error_of(response: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    error: dict[str, Any] = (await response.json())["error"]
    return error


async def test_admin_group_passes_every_method(apiserver: ApiServer) -> None:
    async with api(apiserver) as (client, _, _):
        assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))).status == 200
        # No admin routes exist yet: past authentication a POST meets the ordinary 405.
        response = await client.post("/api/v1/nodes", headers=bearer(ADMIN_SA))
        assert (await error_of(response, 405))["code"] == "method_not_allowed"


async def test_read_group_reads_but_may_not_post(apiserver: ApiServer) -> None:
    async with api(apiserver) as (client, _, _):
        for path in ("/api/v1/nodes", "/api/v1/nodes/gpu-001", "/metrics"):
            assert (await client.get(path, headers=bearer(READ_SA))).status == 200, path
        error = await error_of(await client.post("/api/v1/nodes", headers=bearer(READ_SA)), 403)
        assert error["code"] == "forbidden"
        assert (
            error["message"] == "POST needs an admin token; alice (TokenReview) has the read scope"
        )


async def test_invalid_token_is_401(apiserver: ApiServer, reviews: Reviews) -> None:
    async with api(apiserver) as (client, _, _):
        response = await client.get("/api/v1/nodes", headers=bearer(EXPIRED))
        assert (await error_of(response, 401))["code"] == "unauthorized"
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
        # Not even token-shaped: refused without asking the API server.
        response = await client.get("/api/v1/nodes", headers={"Authorization": "Bearer a b!"})
        assert response.status == 401
    assert reviews.tokens() == [EXPIRED]


async def test_identity_in_no_configured_group_is_403(apiserver: ApiServer) -> None:
    async with api(apiserver) as (client, _, _):
        error = await error_of(await client.get("/api/v1/nodes", headers=bearer(STRANGER)), 403)
    assert error["code"] == "forbidden"
    assert error["message"].startswith("authenticated as bob but not allowed")
    assert "nicfleet:readers" in error["message"]


async def test_configured_groups_and_users_replace_the_defaults(apiserver: ApiServer) -> None:
    settings = ReviewSettings(
        read_groups=("system:authenticated",), admin_groups=(), admin_users=("alice",)
    )
    async with api(apiserver, settings) as (client, _, _):
        assert (await client.get("/api/v1/nodes", headers=bearer(STRANGER))).status == 200
        assert (await client.post("/api/v1/nodes", headers=bearer(READ_SA))).status == 405
        response = await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))
        assert response.status == 403  # nicfleet:admins is no longer configured


async def test_review_request_carries_token_and_audiences(
    apiserver: ApiServer, reviews: Reviews
) -> None:
    settings = ReviewSettings(audiences=("nicfleet", "nicfleet.example"))
    async with api(apiserver, settings) as (client, _, _):
        assert (await client.get("/api/v1/nodes", headers=bearer(READ_SA))).status == 200
    (body,) = reviews.requests
    assert body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["kind"] == "TokenReview"
    assert body["spec"] == {"token": READ_SA, "audiences": ["nicfleet", "nicfleet.example"]}
    (request,) = [r for r in list(apiserver) if r.url.path == TOKENREVIEWS]
    assert request.method == "POST"


async def test_repeated_and_concurrent_requests_make_one_review(
    apiserver: ApiServer, reviews: Reviews
) -> None:
    async with api(apiserver) as (client, reviewer, _):
        answers = await asyncio.gather(
            *(client.get("/api/v1/nodes", headers=bearer(READ_SA)) for _ in range(30))
        )
        assert {r.status for r in answers} == {200}
        for _ in range(5):
            assert (await client.get("/api/v1/policy", headers=bearer(READ_SA))).status == 200
        assert reviewer.reviews == 1
    assert reviews.tokens() == [READ_SA]


async def test_file_tokens_are_checked_first(apiserver: ApiServer, reviews: Reviews) -> None:
    auth = parse_token_file(f"read {FILE_READ}\n", source="tokens")
    async with api(apiserver, auth=auth) as (client, _, _):
        assert (await client.get("/api/v1/nodes", headers=bearer(FILE_READ))).status == 200
        assert (await client.post("/api/v1/nodes", headers=bearer(FILE_READ))).status == 403
        assert reviews.tokens() == []  # a file token never leaves the process
        assert (await client.post("/api/v1/nodes", headers=bearer(ADMIN_SA))).status == 405
    assert reviews.tokens() == [ADMIN_SA]


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        pytest.param(503, "503", id="apiserver-503"),
        pytest.param(429, "429", id="throttled"),
        pytest.param(403, "system:auth-delegator", id="rbac-missing"),
    ],
)
async def test_apiserver_refusing_the_review_is_503(
    apiserver: ApiServer, reviews: Reviews, status: int, fragment: str
) -> None:
    reviews.status = status
    async with api(apiserver) as (client, _, _):
        response = await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))
        error = await error_of(response, 503)
        assert error["code"] == "auth_unavailable"
        assert "TokenReview" in error["message"] and fragment in error["message"]
        reviews.status = 201  # failures are not cached: the next request asks again
        assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))).status == 200


async def test_apiserver_unreachable_is_503_then_recovers(apiserver: ApiServer) -> None:
    async with kmock.Server(apiserver) as probe:
        port = probe.url.port  # a free port, and nothing listens on it after this block
    kube = await KubeClient.connect(KubeSettings(host=f"http://127.0.0.1:{port}"))
    async with kube:
        reviewer = TokenReviewer(kube.review_token, ReviewSettings(), clock=time.monotonic)
        app = build_app(
            fleet=sample_fleet(),
            settings=ApiSettings(stale_after=STALE_AFTER),
            readiness=Readiness(),
            clock=FakeClock(),
            metrics=CollectorRegistry(),
            token_review=reviewer,
        )
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))
            error = await error_of(response, 503)
            assert error["code"] == "auth_unavailable"
            assert "cannot verify the token" in error["message"]
            assert (await client.get("/healthz")).status == 200  # probes stay open
            async with kmock.Server(apiserver, port=port):
                response = await client.get("/api/v1/nodes", headers=bearer(ADMIN_SA))
                assert response.status == 200, await response.text()
            metrics = await (await client.get("/metrics", headers=bearer(ADMIN_SA))).text()
    assert 'nicfleet_api_auth_total{method="tokenreview",result="unavailable"} 1.0' in metrics
    assert 'nicfleet_api_auth_total{method="tokenreview",result="ok"} 2.0' in metrics


async def test_decisions_are_counted(apiserver: ApiServer) -> None:
    auth = parse_token_file(f"read {FILE_READ}\n", source="tokens")
    async with api(apiserver, auth=auth) as (client, _, registry):
        await client.get("/api/v1/nodes")
        await client.get("/api/v1/nodes", headers=bearer(FILE_READ))
        await client.post("/api/v1/nodes", headers=bearer(FILE_READ))
        await client.get("/api/v1/nodes", headers=bearer(EXPIRED))
        await client.get("/api/v1/nodes", headers=bearer(STRANGER))
        await client.post("/api/v1/nodes", headers=bearer(READ_SA))
    counts = {
        (s.labels["method"], s.labels["result"]): s.value
        for metric in registry.collect()
        if metric.name == "nicfleet_api_auth"
        for s in metric.samples
        if s.name == "nicfleet_api_auth_total"
    }
    assert counts == {
        ("none", "unauthenticated"): 1,
        ("file", "ok"): 1,
        ("file", "forbidden"): 1,
        ("tokenreview", "unauthenticated"): 1,
        ("tokenreview", "forbidden"): 2,
    }


async def test_no_token_in_logs_metrics_or_answers(
    apiserver: ApiServer, reviews: Reviews, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    auth = parse_token_file(f"read {FILE_READ}\n", source="tokens")
    seen: list[str] = []
    async with api(apiserver, auth=auth) as (client, reviewer, _):
        for token in SECRETS:
            for method in ("GET", "POST"):
                response = await client.request(method, "/api/v1/nodes", headers=bearer(token))
                seen.append(await response.text())
        reviews.status = 500  # a failing review, with the token in the request body
        unseen = ADMIN_SA + "x"
        response = await client.get("/api/v1/nodes", headers=bearer(unseen))
        assert response.status == 503
        seen.append(await response.text())
        seen.append(await (await client.get("/metrics", headers=bearer(READ_SA))).text())
        seen.append(repr(reviewer) + repr(reviewer.cache) + repr(reviewer.settings))
    assert any(r.name == "aggregator.api.auth" for r in caplog.records)
    shown = caplog.text + "\n".join(r.getMessage() for r in caplog.records) + "\n".join(seen)
    for secret in (*SECRETS, unseen):
        assert secret not in shown


async def test_aggregator_with_token_review_serves_nicfleetctl(
    apiserver: ApiServer, reviews: Reviews, nats_server: NatsServer, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The real wiring: settings.api_token_review + settings.kube reach the served API, and a
    ServiceAccount token in nicfleetctl's --token-file works like a file token."""
    caplog.set_level(logging.DEBUG)
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_SA + "\n")
    stranger_file = tmp_path / "stranger-token"
    stranger_file.write_text(STRANGER)
    async with kmock.Server(apiserver) as server:
        service = AggregatorService(
            AggregatorSettings(
                nats_url=nats_server.url,
                listen_port=0,
                kube=KubeSettings(host=str(server.url)),
                api_token_review=ReviewSettings(),
                identity="tokenreview-test",
            )
        )
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), 15)
                url = service.api_url or ""
                async with httpx.AsyncClient(base_url=url) as http:
                    assert (await http.get("/healthz")).status_code == 200
                    assert (await http.get("/api/v1/nodes")).status_code == 401
                    ok = await http.get("/api/v1/nodes", headers=bearer(READ_SA))
                    assert ok.status_code == 200, ok.text
                    refused = await http.post("/api/v1/nodes", headers=bearer(READ_SA))
                    assert refused.status_code == 403
                # The CLI blocks its thread; the aggregator and kmock keep running here.
                good = await asyncio.to_thread(ctl, url, admin_file, "nodes", "-o", "json")
                bad = await asyncio.to_thread(ctl, url, stranger_file, "nodes")
            finally:
                stop.set()
    assert good.exit_code == 0, good.output
    assert '"items"' in good.stdout
    assert bad.exit_code == 4, bad.output
    assert "authenticated as bob but not allowed" in bad.stderr
    assert reviews.tokens() == [READ_SA, ADMIN_SA, STRANGER]
    assert service.token_reviewer is not None and service.token_reviewer.reviews == 3
    for secret in SECRETS:
        assert secret not in caplog.text and secret not in good.output + bad.output


def ctl(server: str, token_file: Path, *args: str) -> Result:
    env: dict[str, str | None] = {"NICFLEET_SERVER": None, "NICFLEET_TOKEN_FILE": None}
    return CliRunner().invoke(
        cli, ["--server", server, "--token-file", str(token_file), *args], env=env
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--api-token-review"],
            "error: --api-token-review: needs --in-cluster, --kubeconfig or --kube-api",
            id="no-cluster",
        ),
        pytest.param(
            ["--api-review-admin-group", "ops"],
            "error: --api-review-admin-group: needs --api-token-review",
            id="group-without-review",
        ),
        pytest.param(
            [
                "--api-token-review",
                "--kube-api",
                "http://127.0.0.1:1",
                "--api-review-audience",
                " ",
            ],
            "error: --api-review-audience: must not be empty",
            id="empty-audience",
        ),
    ],
)
def test_aggregator_refuses_bad_review_flags(args: list[str], message: str) -> None:
    result = CliRunner().invoke(aggregator_cli, ["run", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_aggregator_help_documents_the_review_flags() -> None:
    text = CliRunner().invoke(aggregator_cli, ["run", "--help"]).stdout
    for flag in ("--api-token-review", "--api-review-read-group", "--api-review-admin-user"):
        assert flag in text
    assert "nicfleet:readers" in text and "nicfleet:admins" in text
