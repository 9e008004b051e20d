"""The OpenAPI document: every registered route is documented and vice versa, the security
section follows the token settings, and the document is valid OpenAPI 3.1."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
import schemathesis
from aiohttp import web
from prometheus_client import CollectorRegistry

from aggregator import __version__
from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.openapi import UndocumentedRoute, openapi_document
from aggregator.api.openapiops import OPERATIONS
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.finding import Finding
from proto.policy import Policy

Route = tuple[str, str]


def _no_rules(
    fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
) -> Sequence[Finding]:
    return ()


def full_app() -> web.Application:
    """What AggregatorService serves: build_app plus the alert routes."""
    fleet = Fleet()
    app = build_app(
        fleet=fleet, settings=ApiSettings(), readiness=lambda: (True, "ok"), clock=lambda: 0.0
    )
    engine = AlertEngine(
        fleet=fleet,
        changes=ChangeFeed().subscribe(),
        evaluate=_no_rules,
        policies=lambda: (),
        cluster=lambda: NO_CLUSTER,
        settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()),
        broker=Broker(first_id=1),
        clock=lambda: 0.0,
    )
    add_alert_routes(app, engine=engine)
    return app


def registered(app: web.Application) -> set[Route]:
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}


def document(routes: Iterable[Route], **kwargs: bool) -> dict[str, object]:
    return openapi_document(
        routes, version=__version__, secured=kwargs.pop("secured", False), **kwargs
    )


def test_every_registered_route_is_documented_and_vice_versa() -> None:
    routes = registered(full_app())
    gets = {path for method, path in routes if method == "GET"}
    assert {method for method, _ in routes} == {"GET", "HEAD"}
    assert {path for method, path in routes if method == "HEAD"} == gets  # aiohttp's twins
    assert gets == set(OPERATIONS)
    doc = document(routes)
    paths = doc["paths"]
    assert isinstance(paths, dict)
    assert set(paths) == gets
    assert all(set(ops) == {"get"} for ops in paths.values())


def test_an_undocumented_route_fails_loudly() -> None:
    with pytest.raises(UndocumentedRoute, match="GET /api/v1/new"):
        document({("GET", "/healthz"), ("GET", "/api/v1/new")})
    with pytest.raises(UndocumentedRoute, match="POST /api/v1/nodes"):
        document({("POST", "/api/v1/nodes")})


def test_open_api_has_no_security_section() -> None:
    doc = document({("GET", p) for p in OPERATIONS})
    assert "security" not in doc
    assert "securitySchemes" not in doc["components"]  # type: ignore[operator]
    for ops in doc["paths"].values():  # type: ignore[attr-defined]
        assert "security" not in ops["get"]
        assert "401" not in ops["get"]["responses"]


@pytest.mark.parametrize("metrics_public", [False, True])
def test_secured_api_declares_bearer_and_401(metrics_public: bool) -> None:
    doc = document({("GET", p) for p in OPERATIONS}, secured=True, metrics_public=metrics_public)
    assert doc["security"] == [{"bearer": []}]
    schemes = doc["components"]["securitySchemes"]  # type: ignore[index]
    assert schemes == {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": schemes["bearer"]["description"],
        }
    }
    open_paths = {"/healthz", "/readyz"} | ({"/metrics"} if metrics_public else set())
    for path, ops in doc["paths"].items():  # type: ignore[attr-defined]
        get = ops["get"]
        if path in open_paths:
            assert get["security"] == [], path
            assert "401" not in get["responses"], path
        else:
            assert "security" not in get, path
            assert get["responses"]["401"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }


@pytest.mark.parametrize("secured", [False, True])
def test_document_is_valid_openapi_31_and_deterministic(secured: bool) -> None:
    routes = registered(full_app())
    doc = document(routes, secured=secured)
    assert doc == document(sorted(routes, reverse=True), secured=secured)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["version"] == __version__  # type: ignore[index]
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()  # against the OpenAPI 3.1 meta-schema
    labels = {r.ok().label for r in schema.get_all_operations()}  # type: ignore[union-attr]
    assert labels == {f"GET {path}" for path in OPERATIONS}
    # Every $ref resolves to a component.
    components = doc["components"]["schemas"]  # type: ignore[index]
    assert all(ref.split("/")[-1] in components for ref in _refs(doc))


def test_every_operation_declares_its_status_codes() -> None:
    doc = document({("GET", p) for p in OPERATIONS})
    responses = {p: ops["get"]["responses"] for p, ops in doc["paths"].items()}  # type: ignore[attr-defined]
    codes = {p: set(r) for p, r in responses.items()}
    assert codes["/api/v1/nodes/{node}"] == {"200", "400", "404", "503"}
    assert codes["/api/v1/trace"] == {"200", "400", "404", "503"}
    assert codes["/readyz"] == {"200", "400", "503"}
    for path in ("/healthz", "/metrics", "/api/v1/policy", "/api/v1/openapi.json"):
        assert codes[path] == {"200", "400", "503"}, path
        assert set(responses[path]["400"]["content"]) == {"text/plain"}, path
    for path in ("/api/v1/nodes", "/api/v1/findings", "/api/v1/alerts", "/api/v1/resources"):
        assert codes[path] == {"200", "400", "503"}, path
        assert set(responses[path]["400"]["content"]) == {"application/json", "text/plain"}
    # 503: any route may meet a bound of aggregator.api.limits; /readyz keeps its own reason.
    assert all("Retry-After" in r["503"]["description"] for r in responses.values())
    assert responses["/readyz"]["503"]["description"].startswith("Not ready")
    sse = responses["/api/v1/alerts/stream"]["200"]["content"]
    assert set(sse) == {"text/event-stream"}
    assert set(responses["/metrics"]["200"]["content"]) == {"text/plain; version=0.0.4"}


def test_token_review_adds_403_and_503_to_protected_operations() -> None:
    doc = document({("GET", p) for p in OPERATIONS}, secured=True, token_review=True)
    for path, ops in doc["paths"].items():  # type: ignore[attr-defined]
        codes = set(ops["get"]["responses"])
        if path in ("/healthz", "/readyz"):
            assert not codes & {"401", "403"}, path
        else:
            assert {"401", "403", "503"} <= codes, path


def test_the_post_declares_its_bounds_and_the_no_token_refusals() -> None:
    route = {("POST", "/api/v1/validations")}
    open_post = document(route)["paths"]["/api/v1/validations"]["post"]["responses"]  # type: ignore[index]
    assert {"400", "403", "408", "415", "503"} <= set(open_post)
    assert "deeper than 16 levels" in open_post["400"]["description"]
    assert "4096 bytes" in open_post["400"]["description"]
    assert "Origin" in open_post["403"]["description"]
    secured = document(route, secured=True)["paths"]["/api/v1/validations"]["post"]["responses"]  # type: ignore[index]
    assert "415" not in secured  # with tokens a cross-site page has no credential to send
    assert secured["403"]["description"] == "POST needs an admin token."


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []
