"""Paged `/api/v1/nodes` and `/api/v1/findings` on a real aiohttp server (127.0.0.1): walks
that follow `continue` while nodes come and go, filters, bad `limit`/`continue`, and the
clients (nicfleetctl) following `continue` to the end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.cluster import NO_CLUSTER, ClusterNode, ClusterView
from aggregator.ctl.main import cli
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.finding import Finding, Severity
from proto.policy import Policy
from tests.support.api_fixtures import NOW, STALE_AFTER, Harness, serve_in_thread
from tests.support.builders import T0, snapshot

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
WALK_NODES = 2500
PAGE = 1000
SEVERITY_OF: tuple[Severity, ...] = ("critical", "warning", "info")


def node_name(i: int) -> str:
    return f"node-{i:05}"


def fleet_of(count: int, *, stale_every: int = 0) -> Fleet:
    """`count` nodes; every `stale_every`-th one last heard from long ago (stale)."""
    fleet = Fleet()
    for i in range(count):
        stale = stale_every and i % stale_every == 0
        fleet.apply_snapshot(snapshot(node_name(i)), T0 - 10 * STALE_AFTER if stale else T0)
    return fleet


def findings_for(fleet: Fleet) -> list[Finding]:
    """One finding per node, severity by node number, plus one fleet-wide finding."""
    found = [
        Finding(rule="port-down", severity=SEVERITY_OF[i % 3], node=name, subject="mlx5_0/1",
                message="down")
        for i, name in enumerate(fleet.names())
    ]  # fmt: skip
    found.append(Finding(rule="rail-mismatch", severity="warning", node=None, subject="fleet",
                         message="rails"))  # fmt: skip
    return found


def app_with_findings(fleet: Fleet) -> web.Application:
    app = Harness(fleet=fleet).app()

    def rules(
        fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return findings_for(fleet)

    engine = AlertEngine(
        fleet=fleet,
        changes=ChangeFeed().subscribe(),
        evaluate=rules,
        policies=lambda: (),
        cluster=lambda: NO_CLUSTER,
        settings=EngineSettings(startup_grace_s=0.0),
        metrics=AlertMetrics.create(CollectorRegistry()),
        broker=Broker(first_id=1),
        clock=lambda: T0,
    )
    add_alert_routes(app, engine=engine)

    async def evaluate_once(app: web.Application) -> None:
        await engine.cycle("test")

    app.on_startup.append(evaluate_once)
    return app


@pytest.fixture
def fleet() -> Fleet:
    return fleet_of(WALK_NODES, stale_every=5)


@pytest.fixture
async def client(fleet: Fleet) -> AsyncIterator[Client]:
    async with TestClient(TestServer(app_with_findings(fleet), host="127.0.0.1")) as c:
        yield c


async def get_json(client: Client, path: str, status: int = 200, **params: Any) -> Any:
    response = await client.get(path, params=params)
    assert response.status == status, await response.text()
    return await response.json()


async def walk(client: Client, path: str, between: Any = None, **params: Any) -> list[Any]:
    """Every page of `path` following `continue`; `between(page_number)` runs after each."""
    items: list[Any] = []
    token = None
    for number in range(100):
        query = {**params, **({"continue": token} if token else {})}
        body = await get_json(client, path, **query)
        assert body["count"] == len(body["items"])
        items.extend(body["items"])
        token = body.get("continue")
        if token is None:
            return items
        if between is not None:
            await between(number)
    raise AssertionError("the walk never ended")


async def test_walk_2500_nodes_in_pages_of_1000(client: Client) -> None:
    first = await get_json(client, "/api/v1/nodes", limit=PAGE)
    assert (first["count"], first["total"], first["limit"]) == (PAGE, WALK_NODES, PAGE)
    assert isinstance(first["continue"], str)
    names = [i["name"] for i in await walk(client, "/api/v1/nodes", limit=PAGE)]
    assert names == [node_name(i) for i in range(WALK_NODES)]


async def test_walk_while_nodes_are_added_and_removed_between_pages(
    client: Client, fleet: Fleet
) -> None:
    before = set(fleet.names())
    removed: set[str] = set()

    async def churn(page: int) -> None:
        # Before the cursor (already passed), after it (still ahead), and removals on both.
        for i in range(3):
            fleet.apply_snapshot(snapshot(f"node-{page * 400 + i:05}a"), T0)  # before
            fleet.apply_snapshot(snapshot(f"node-{2000 + page * 10 + i:05}b"), T0)  # ahead
        for name in (node_name(page * 100 + 1), node_name(2400 - page)):
            fleet.forget(name)
            removed.add(name)

    names = [i["name"] for i in await walk(client, "/api/v1/nodes", churn, limit=PAGE)]
    assert len(names) == len(set(names)), "a node was listed twice"
    assert names == sorted(names)
    assert before - removed <= set(names), "a node present for the whole walk was skipped"
    assert {n for n in names if n.endswith("b")}, "nodes added ahead of the cursor are listed"


async def test_walk_while_a_task_keeps_changing_the_fleet(client: Client, fleet: Fleet) -> None:
    """Real concurrency: a task adds and removes nodes while the walk's requests run."""
    stop = asyncio.Event()
    steady = {node_name(i) for i in range(WALK_NODES) if i % 7}

    async def churn() -> None:
        n = 0
        while not stop.is_set():
            fleet.apply_snapshot(snapshot(f"node-{n * 37 % WALK_NODES:05}x"), T0)
            fleet.forget(node_name(n * 7 % WALK_NODES))  # only multiples of 7 go
            n += 1
            await asyncio.sleep(0)  # yield to the server between changes, not a wait

    async with asyncio.TaskGroup() as group:
        group.create_task(churn())
        try:
            names = [i["name"] for i in await walk(client, "/api/v1/nodes", limit=PAGE)]
        finally:
            stop.set()
    assert len(names) == len(set(names))
    assert steady <= set(names)


@pytest.mark.parametrize(
    ("params", "total"),
    [
        pytest.param({"state": "stale"}, WALK_NODES // 5, id="state"),
        pytest.param({"name": "node-01"}, 1000, id="prefix"),
        pytest.param({"name": "node-0001?"}, 10, id="glob"),
        pytest.param({"name": "*[05]", "state": "ready"}, 0, id="glob-and-state"),
        pytest.param({"name": "*[16]", "state": "ready"}, 500, id="glob-and-state-some"),
    ],
)
async def test_filtered_walks(client: Client, params: dict[str, Any], total: int) -> None:
    body = await get_json(client, "/api/v1/nodes", limit=300, **params)
    assert body["total"] == total
    assert ("continue" in body) == (total > 300)
    items = await walk(client, "/api/v1/nodes", limit=300, **params)
    assert len(items) == total
    if "state" in params:
        assert {i["state"] for i in items} <= {params["state"]}


async def test_findings_walk_and_filters(client: Client) -> None:
    items = await walk(client, "/api/v1/findings", limit=PAGE)
    assert len(items) == WALK_NODES + 1
    ranks = [SEVERITY_OF.index(f["severity"]) for f in items]
    assert ranks == sorted(ranks)  # most severe first, across pages
    critical = await get_json(client, "/api/v1/findings", severity="critical", limit=100)
    assert critical["total"] == len(range(0, WALK_NODES, 3))
    assert {f["severity"] for f in critical["items"]} == {"critical"}
    assert len(await walk(client, "/api/v1/findings", severity="critical", limit=100)) == 834
    one = await get_json(client, "/api/v1/findings", node=node_name(4))
    assert (one["count"], one["total"], "continue" in one) == (1, 1, False)
    fleet_wide = await get_json(client, "/api/v1/findings", node="_fleet", rule="rail-mismatch")
    assert [f["subject"] for f in fleet_wide["items"]] == ["fleet"]
    default = await get_json(client, "/api/v1/findings")
    assert (default["count"], default["total"]) == (500, WALK_NODES + 1)


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/findings"])
@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({"limit": "0"}, "limit", id="limit-zero"),
        pytest.param({"limit": "-5"}, "limit", id="limit-negative"),
        pytest.param({"limit": "5001"}, "limit", id="limit-over-max"),
        pytest.param({"limit": "99999999999999"}, "limit", id="limit-huge"),
        pytest.param({"limit": "ten"}, "limit", id="limit-not-integer"),
        pytest.param({"limit": "2.0"}, "limit", id="limit-fraction"),
        pytest.param({"continue": "garbage"}, "continue", id="continue-garbage"),
        pytest.param({"continue": ""}, "continue", id="continue-empty"),
        pytest.param({"continue": "A" * 5000}, "continue", id="continue-huge"),
        pytest.param({"continue": "a", "limit": "1"}, "continue", id="continue-short"),
    ],
)
async def test_bad_paging_is_400_naming_the_field(
    client: Client, path: str, params: dict[str, str], field: str
) -> None:
    body = await get_json(client, path, 400, **params)
    assert body["error"]["field"] == field
    assert (await get_json(client, path, limit=1))["count"] == 1  # still serving


async def test_continue_is_bound_to_its_list_and_filters(client: Client) -> None:
    ready = await get_json(client, "/api/v1/nodes", state="ready", limit=10)
    token = ready["continue"]
    assert (await get_json(client, "/api/v1/nodes", state="ready", limit=3, **{"continue": token}))[
        "count"
    ] == 3  # another page size is fine
    for path, params in [
        ("/api/v1/nodes", {"state": "stale"}),
        ("/api/v1/nodes", {}),
        ("/api/v1/nodes", {"state": "ready", "name": "node"}),
        ("/api/v1/findings", {}),
    ]:
        body = await get_json(client, path, 400, **params, **{"continue": token})
        assert body["error"]["field"] == "continue"
        assert "other filters" in body["error"]["message"]
    crit = await get_json(client, "/api/v1/findings", severity="critical", limit=5)
    body = await get_json(client, "/api/v1/findings", 400, severity="info",
                          **{"continue": crit["continue"]})  # fmt: skip
    assert body["error"]["field"] == "continue"
    edited = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    body = await get_json(client, "/api/v1/nodes", 400, state="ready", **{"continue": edited})
    assert body["error"]["field"] == "continue"


async def test_a_cursor_survives_the_removal_of_its_own_node(client: Client, fleet: Fleet) -> None:
    page = await get_json(client, "/api/v1/nodes", limit=10)
    fleet.forget(page["items"][-1]["name"])  # node-00009
    following = await get_json(client, "/api/v1/nodes", limit=2, **{"continue": page["continue"]})
    assert [i["name"] for i in following["items"]] == [node_name(10), node_name(11)]


def rack_cluster(count: int) -> ClusterView:
    """Every node but the last 100 in the cluster, labelled rack=r0..r3; every 10th cordoned."""
    nodes = {}
    for i in range(count - 100):
        labels = {"rack": f"r{i % 4}", "nicfleet.io/rail": str(i % 8)}
        if i % 10 == 0:
            labels["cordoned"] = ""
        nodes[node_name(i)] = ClusterNode(name=node_name(i), labels=labels)
    return ClusterView(present=True, nodes=nodes)


@pytest.mark.parametrize(
    ("label", "total"),
    [
        pytest.param("rack=r1", 600, id="equals"),
        pytest.param("rack!=r1", 1900, id="not-equals-includes-unlabelled"),
        pytest.param("cordoned", 240, id="exists"),
        pytest.param("!cordoned", 2260, id="absent"),
        pytest.param("rack=r2,nicfleet.io/rail=6,!cordoned", 240, id="all-of"),
        pytest.param("rack=r9", 0, id="none"),
    ],
)
async def test_label_selector_on_the_cluster_view(label: str, total: int) -> None:
    fleet = fleet_of(WALK_NODES)
    cluster = rack_cluster(WALK_NODES)
    app = build_app(
        fleet=fleet,
        settings=ApiSettings(stale_after=STALE_AFTER),
        readiness=lambda: (True, "ok"),
        clock=lambda: NOW,
        cluster_source=lambda: cluster,
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        body = await get_json(client, "/api/v1/nodes", label=label, limit=200)
        assert body["total"] == total
        items = await walk(client, "/api/v1/nodes", label=label, limit=500)
        assert len(items) == total
        assert len({i["name"] for i in items}) == total
        bad = await get_json(client, "/api/v1/nodes", 400, label="rack in (r1)")
        assert bad["error"]["field"] == "label"
        if "continue" in body:
            other = await get_json(client, "/api/v1/nodes", 400, label="rack=r3",
                                   **{"continue": body["continue"]})  # fmt: skip
            assert other["error"]["field"] == "continue"


@pytest.fixture(scope="module")
def big_server() -> Iterator[str]:
    with serve_in_thread(app_with_findings(fleet_of(1234, stale_every=3))) as url:
        yield url


def test_nicfleetctl_follows_continue(big_server: str) -> None:
    """`nodes` and `findings` list every item although each page holds 500."""
    env = {"NICFLEET_SERVER": None, "NO_COLOR": None}
    result = CliRunner().invoke(cli, ["--server", big_server, "nodes", "-o", "json"], env=env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert [i["name"] for i in body["items"]] == [node_name(i) for i in range(1234)]
    assert (body["count"], body["total"], "continue" in body) == (1234, 1234, False)
    assert httpx.get(f"{big_server}/api/v1/nodes").json()["count"] == 500
    stale = CliRunner().invoke(cli, ["--server", big_server, "nodes", "--state", "stale"], env=env)
    assert stale.exit_code == 0, stale.output
    assert len(stale.stdout.splitlines()) == 1 + len(range(0, 1234, 3))  # header + rows
    found = CliRunner().invoke(cli, ["--server", big_server, "findings", "-o", "json"], env=env)
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["count"] == 1235
    watched = CliRunner().invoke(
        cli, ["--server", big_server, "nodes", "--watch", "--watch-count", "1"], env=env
    )
    assert watched.exit_code == 0, watched.output
    assert node_name(1233) in watched.stdout
