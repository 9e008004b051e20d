"""schemathesis against the served OpenAPI document of a live aggregator API (127.0.0.1):
a fleet with device-plugin status, policies, a cluster view, findings and alerts, served
open and with a token file. Every 5xx, undeclared status, content type or body is a bug."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from prometheus_client import CollectorRegistry
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import StreamSettings, add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth, load_token_file
from aggregator.api.limits import HttpLimits, HttpLimitSettings
from aggregator.cluster import ClusterView
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.reconcile.loop import NodePlan, ReconcileReport
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from proto.policy import Policy
from tests.support.api_fixtures import NOW, STALE_AFTER, FakeClock, Readiness, serve_in_thread
from tests.support.builders import T0, counters, rdma_policy, snapshot
from tests.support.chain_fixtures import RES, chain_cluster, chain_fleet

pytestmark = pytest.mark.integration

# Examples per operation and generation mode: the open run fuzzes, the token run checks that
# the document's security works; the file runs in 15-20 s on 2 busy cores.
MAX_EXAMPLES = 25
MAX_EXAMPLES_WITH_TOKEN = 10
READ_TOKEN = "read-token-0123456789abcdef"
SSE_PATH = "/api/v1/alerts/stream"
OPENAPI = "/api/v1/openapi.json"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_acceptance,  # valid per the document: 2xx or 404, never 400
    negative_data_rejection,  # invalid per the document: 4xx, never 200
]
# Real values, so the bodies of 200s (node detail, trace, filtered lists) are checked too.
KNOWN: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/api/v1/nodes/{node}", {"path_parameters": {"node": "gpu-001"}}),
    ("/api/v1/nodes/{node}", {"path_parameters": {"node": "gpu-002"}}),
    ("/api/v1/nodes/{node}", {"path_parameters": {"node": "gpu-003"}}),
    ("/api/v1/nodes/{node}", {"path_parameters": {"node": "gpu-010"}}),
    ("/api/v1/nodes/{node}", {"path_parameters": {"node": "gpu-00"}}),  # 404 + suggestions
    ("/api/v1/nodes", {"query": {"state": "stale", "limit": 1, "offset": 0}}),
    ("/api/v1/nodes", {"query": {"name": "gpu-0*", "label": "!cordoned,rack!=r1", "limit": 2}}),
    ("/api/v1/findings", {"query": {"severity": "critical", "limit": 1}}),
    ("/api/v1/trace", {"query": {"node": "gpu-001", "resource": RES}}),
    ("/api/v1/trace", {"query": {"node": "gpu-002", "resource": RES}}),
    ("/api/v1/trace", {"query": {"node": "gpu-002", "resource": "rdma/other"}}),  # 404
    (
        "/api/v1/trace/pods/{namespace}/{name}",
        {"path_parameters": {"namespace": "ml", "name": "t-0"}},
    ),
    ("/api/v1/resources", {"query": {"node": "gpu-002", "name": RES}}),
    ("/api/v1/findings", {"query": {"node": "_fleet", "severity": "warning"}}),
    ("/api/v1/alerts", {"query": {"node": "gpu-002", "status": "firing"}}),
)


def lab_fleet() -> Fleet:
    """chain_fleet (gpu-001 healthy, gpu-002 ports down) plus a stale and a counters-only node."""
    fleet = chain_fleet()
    fleet.apply_snapshot(snapshot("gpu-003"), T0 - 100)
    fleet.apply_counters(counters("gpu-010"), T0 + 3)
    return fleet


def live_app(*, auth: ApiAuth | None, with_report: bool) -> web.Application:
    """What AggregatorService serves: build_app plus the alert routes of an engine that has
    evaluated the real rules once (findings, firing alerts)."""
    fleet, cluster, clock = lab_fleet(), chain_cluster(), FakeClock()
    policies = (rdma_policy("ib", RES),)
    report = ReconcileReport(
        at=NOW,
        leader=True,
        policy_version=3,
        policies=policies,
        nodes=(NodePlan(node="gpu-001", policy="ib"), NodePlan(node="gpu-002", policy=None)),
        errors=("policy 'broken': spec.resources[0]: missing resourceName",),
    )
    registry = CollectorRegistry()
    limits = HttpLimits.create(HttpLimitSettings(), registry)  # the service's bounds
    app = build_app(
        fleet=fleet,
        settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=Readiness(),
        clock=clock,
        metrics=registry,
        policies=policies,
        cluster_source=lambda: cluster,
        policy_report=(lambda: report) if with_report else None,
        auth=auth,
        limits=limits,
    )

    def rules(
        fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return evaluate(fleet.view(), policies, cluster, now)

    engine = AlertEngine(
        fleet=fleet,
        changes=ChangeFeed().subscribe(),
        evaluate=rules,
        policies=lambda: policies,
        cluster=lambda: cluster,
        settings=EngineSettings(startup_grace_s=0.0),
        metrics=AlertMetrics.create(CollectorRegistry()),
        broker=Broker(first_id=1),
        clock=clock,
    )
    add_alert_routes(app, engine=engine, settings=StreamSettings(heartbeat_s=0.2), limits=limits)

    async def evaluate_once(app: web.Application) -> None:
        await engine.cycle("test")

    async def close_streams(app: web.Application) -> None:
        engine.broker.close()

    app.on_startup.append(evaluate_once)
    app.on_shutdown.append(close_streams)
    return app


@pytest.fixture(scope="module")
def open_url() -> Iterator[str]:
    with serve_in_thread(live_app(auth=None, with_report=False)) as url:
        yield url


@pytest.fixture(scope="module")
def secured_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text(f"# test tokens\nread {READ_TOKEN}\nadmin admin-token-0123456789abcdef\n")
    with serve_in_thread(live_app(auth=load_token_file(path), with_report=True)) as url:
        yield url


Operation = schemathesis.APIOperation[Any, Any, Any, Any]


def load(url: str, headers: dict[str, str]) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(url + OPENAPI, headers=headers)


def operations(schema: schemathesis.BaseSchema) -> list[Operation]:
    return [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]


Statuses = dict[str, Counter[int]]  # operation label -> status codes answered


def fuzz(url: str, headers: dict[str, str], examples: int) -> Statuses:
    """Every operation but the SSE stream with positive, then (if it has parameters)
    negative data, then the known-value cases; every response passes `CHECKS`."""
    schema = load(url, headers)
    statuses: Statuses = {}
    with requests.Session() as session:
        for operation in operations(schema):
            if operation.path == SSE_PATH:
                continue
            seen = statuses.setdefault(operation.label, Counter())
            modes = [schemathesis.GenerationMode.POSITIVE]
            if operation.definition.raw.get("parameters"):
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:
                generate(operation, mode, examples, url, session, headers, seen)
        for path, values in KNOWN:
            case = schema[path]["GET"].Case(**values)
            response = case.call_and_validate(
                base_url=url, session=session, headers=headers, checks=CHECKS
            )
            statuses[case.operation.label][response.status_code] += 1
    return statuses


def generate(
    operation: Operation,
    mode: schemathesis.GenerationMode,
    examples: int,
    url: str,
    session: requests.Session,
    headers: dict[str, str],
    seen: Counter[int],
) -> None:
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case[Operation]) -> None:
        # The real token replaces the generated one; a case whose negation is "no
        # Authorization header" is sent without one (and must get its 401).
        sent = headers if case.headers and "Authorization" in case.headers else {}
        if mode == schemathesis.GenerationMode.POSITIVE:
            use_issued_token(case, url, session, sent)
        response = case.call_and_validate(
            base_url=url, session=session, headers=sent, checks=CHECKS
        )
        seen[response.status_code] += 1

    run()


def use_issued_token(
    case: schemathesis.Case[Operation], url: str, session: requests.Session, headers: dict[str, str]
) -> None:
    """Valid data for `continue` is a token the server issued for the same filters (any
    other string is rightly a 400): ask for one, or drop `continue` if one page holds all."""
    query = case.query
    if not query or "continue" not in query:
        return
    filters = {k: v for k, v in query.items() if k not in ("continue", "limit", "offset")}
    answer = session.get(url + case.path, params={**filters, "limit": 1}, headers=headers)
    token = answer.json().get("continue") if answer.ok else None
    if isinstance(token, str):
        query["continue"] = token
    else:
        del query["continue"]


def assert_covered(statuses: Statuses, schema: schemathesis.BaseSchema) -> None:
    """Every operation was called and answered 200 at least once (so the token was used)."""
    assert set(statuses) == {op.label for op in operations(schema) if op.path != SSE_PATH}
    assert all(s[500] == 0 for s in statuses.values())
    for op in operations(schema):
        if op.path == SSE_PATH:
            continue
        assert statuses[op.label][200] > 0, (op.label, statuses[op.label])


def test_schemathesis_open_api(open_url: str) -> None:
    statuses = fuzz(open_url, {}, MAX_EXAMPLES)
    schema = load(open_url, {})
    assert_covered(statuses, schema)
    assert all(s[401] == 0 for s in statuses.values())
    for op in operations(schema):  # negative data reached the validation
        if op.path != SSE_PATH and op.definition.raw.get("parameters"):
            assert statuses[op.label][400] > 0, (op.label, statuses[op.label])


def test_schemathesis_with_read_token(secured_url: str) -> None:
    auth = {"Authorization": f"Bearer {READ_TOKEN}"}
    statuses = fuzz(secured_url, auth, MAX_EXAMPLES_WITH_TOKEN)
    assert_covered(statuses, load(secured_url, auth))
    assert sum(s[401] for s in statuses.values()) > 0  # cases negated to "no token"


def test_every_protected_operation_answers_401_without_a_token(secured_url: str) -> None:
    schema = load(secured_url, {"Authorization": f"Bearer {READ_TOKEN}"})
    protected = 0
    for operation in operations(schema):
        response = requests.get(
            secured_url + operation.path.replace("{node}", "gpu-001"),
            headers={"Authorization": "Bearer not-a-known-token-at-all"} if protected % 2 else {},
            timeout=10,
            stream=True,
        )
        with response:
            if operation.path in ("/healthz", "/readyz"):
                assert response.status_code == 200, operation.path
                continue
            protected += 1
            assert response.status_code == 401, operation.path
            assert "401" in operation.definition.raw["responses"]
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert msgspec.json.decode(response.content)["error"]["code"] == "unauthorized"
    assert protected == 11  # schemathesis leaves the document's own route out; checked here:
    assert requests.get(secured_url + OPENAPI, timeout=10).status_code == 401


@pytest.mark.parametrize("secured", [False, True])
def test_sse_stream_has_its_declared_content_type(
    secured: bool, open_url: str, secured_url: str
) -> None:
    url = secured_url if secured else open_url
    headers = {"Authorization": f"Bearer {READ_TOKEN}"} if secured else {}
    schema = load(url, headers)
    operation = schema[SSE_PATH]["GET"]
    declared = operation.definition.raw["responses"]["200"]["content"]
    assert list(declared) == ["text/event-stream"]
    with requests.get(
        url + SSE_PATH, params={"severity": "critical"}, headers=headers, stream=True, timeout=10
    ) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"] == "text/event-stream"  # exactly as declared
        first = next(response.iter_lines())
        assert first.startswith(b"retry: ")


def test_rule_filter_rejects_a_trailing_newline(open_url: str) -> None:
    # Regression: `re.match` with `$` let "port-down\n" through as a filter (200, no items).
    for path in ("/api/v1/findings", "/api/v1/alerts"):
        response = requests.get(open_url + path, params={"rule": "port-down\n"}, timeout=10)
        assert response.status_code == 400, path
        assert response.json()["error"]["field"] == "rule"
    assert requests.get(open_url + "/api/v1/findings?rule=port-down", timeout=10).ok


def test_oversize_request_line_gets_the_declared_400(open_url: str) -> None:
    # Found by schemathesis (negative data, random seed): aiohttp refuses a request line
    # over 8190 bytes as text/plain before the app runs; the document now declares it.
    schema = load(open_url, {})
    for path in ("/api/v1/trace", "/healthz"):
        case = schema[path]["GET"].Case(query={"node": "n" * 9000})
        response = case.call(base_url=open_url)
        assert response.status_code == 400
        case.validate_response(response, checks=CHECKS)
    assert requests.get(open_url + "/healthz", timeout=10).ok  # still serving


@pytest.mark.parametrize(
    ("path", "filters"),
    [
        ("/api/v1/nodes", {}),
        ("/api/v1/nodes", {"state": "ready", "name": "gpu-00"}),
        ("/api/v1/findings", {}),
    ],
)
def test_paged_walk_conforms_page_by_page(
    open_url: str, path: str, filters: dict[str, str]
) -> None:
    """Pages of one item, following the served `continue`: each answer passes `CHECKS`."""
    schema = load(open_url, {})
    query: dict[str, Any] = {**filters, "limit": 1}
    items: list[object] = []
    with requests.Session() as session:
        for _ in range(50):
            case = schema[path]["GET"].Case(query=query)
            response = case.call_and_validate(base_url=open_url, session=session, checks=CHECKS)
            body = response.json()
            items += body["items"]
            if "continue" not in body:
                break
            query = {**query, "continue": body["continue"]}
    assert len(items) == body["total"] > 1
