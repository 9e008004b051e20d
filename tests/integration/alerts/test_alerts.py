"""Alerts end to end on real parts: lab tree → agent → nats-server → aggregator rules →
alert on NATS subjects, the HTTP API and the SSE stream; restart keeps state, no re-notify."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import kmock
import nats
import nats.aio.msg
import pytest
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from agent.lab.faults import port_down, port_up
from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings, Evaluate
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.wiring import NodeEvents
from aggregator.bus.natsserver import NatsServer
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import StoredNode
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.rules.finding import Finding
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import decode
from proto.messages.alerts import Alert
from proto.runtime.natsflush import flush_in_order
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration


@asynccontextmanager
async def aggregator(
    nats_url: str, rules: Evaluate | None = None
) -> AsyncIterator[AggregatorService]:
    """The aggregator with every real rule (or `rules`)."""
    service = AggregatorService(
        AggregatorSettings(nats_url=nats_url, listen_host="127.0.0.1", listen_port=0),
        rules=rules,
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), timeout=15)
        try:
            yield service
        finally:
            stop.set()


class Inbox:
    """Alerts received on one subscription, decoded."""

    def __init__(self) -> None:
        self.alerts: list[tuple[str, Alert]] = []

    async def receive(self, msg: nats.aio.msg.Msg) -> None:
        self.alerts.append((msg.subject, decode(msg.data, Alert)))

    def about(self, node: str, subject: str) -> list[Alert]:
        return [a for _, a in self.alerts if a.node == node and a.subject == subject]


@asynccontextmanager
async def subscriber(url: str, *subjects: str) -> AsyncIterator[tuple[NatsClient, list[Inbox]]]:
    nc = await nats.connect(url)
    inboxes = [Inbox() for _ in subjects]
    for subject, inbox in zip(subjects, inboxes, strict=True):
        await nc.subscribe(subject, cb=inbox.receive)
    await flush_in_order(nc)
    try:
        yield nc, inboxes
    finally:
        await nc.close()


def states(inbox: Inbox, node: str, subject: str) -> list[str]:
    return [a.state for a in inbox.about(node, subject)]


async def test_port_down_alert_on_nats_subjects_and_resolve(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    node = "alert-ib-01"
    root = lab_node(tmp_path, "h100-ib-12nic", node)
    critical = "nicfleet.v1.alert.critical.>"
    other = "nicfleet.v1.alert.*.*.some-other-node"
    mine = f"nicfleet.v1.alert.*.*.{node}"
    async with (
        subscriber(nats_server.url, critical, other, mine) as (nc, (crit, rest, own)),
        aggregator(nats_server.url) as agg,
        agent(nats_server.url, root, node),
    ):
        await wait_until(lambda: node in agg.fleet, what="node in fleet")
        port_down(root, "mlx5_0", 1)
        await wait_until(lambda: states(crit, node, "mlx5_0/1") == ["firing"], what="firing")
        subject, alert = next((s, a) for s, a in crit.alerts if a.subject == "mlx5_0/1")
        assert subject == f"nicfleet.v1.alert.critical.port-down.{node}"
        assert (alert.rule, alert.severity, alert.evidence["state"]) == (
            "port-down", "critical", "DOWN",
        )  # fmt: skip
        port_up(root, "mlx5_0", 1)
        await wait_until(
            lambda: states(crit, node, "mlx5_0/1") == ["firing", "resolved"], what="resolved"
        )
        await nc.flush()
        assert states(own, node, "mlx5_0/1") == ["firing", "resolved"]
        assert rest.alerts == []
        resolved = crit.about(node, "mlx5_0/1")[1]
        assert resolved.ends_at is not None and resolved.starts_at == alert.starts_at


async def read_events(response: httpx.Response, into: list[dict[str, str]]) -> None:
    """Parse an SSE body into {"id", "event", "data"} dicts (comments are skipped)."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in event:
                into.append(event)
            event = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            event[key] = value


async def test_http_views_and_sse_resume(nats_server: NatsServer, tmp_path: Path) -> None:
    node = "alert-sse-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    async with aggregator(nats_server.url) as agg, agent(nats_server.url, root, node):
        await wait_until(lambda: node in agg.fleet, what="node in fleet")
        async with httpx.AsyncClient(base_url=agg.api_url or "", timeout=10) as http:
            events: list[dict[str, str]] = []
            params = {"node": node, "rule": "port-down"}  # other rules fire on this node too
            async with http.stream("GET", "/api/v1/alerts/stream", params=params) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                async with asyncio.TaskGroup() as tasks:
                    reader = tasks.create_task(read_events(response, events))
                    await wait_until(lambda: len(events) >= 1, what="resync event")
                    assert events[0]["event"] == "resync"
                    assert json.loads(events[0]["data"])["alerts"] == []
                    port_down(root, "mlx5_0", 1)
                    await wait_until(lambda: len(events) >= 2, what="alert event")
                    reader.cancel()
            fired = events[1]
            assert fired["event"] == "alert" and int(fired["id"]) > int(events[0]["id"])
            assert json.loads(fired["data"])["state"] == "firing"

            body = (await http.get("/api/v1/alerts", params=params)).json()
            assert [(a["rule"], a["state"]) for a in body["items"]] == [("port-down", "firing")]
            findings = (await http.get("/api/v1/findings", params=params)).json()
            assert [f["subject"] for f in findings["items"]] == ["mlx5_0/1"]
            empty = await http.get("/api/v1/alerts", params={**params, "status": "resolved"})
            assert empty.json()["items"] == []

            # Resolved while nobody listens; a resumed stream gets exactly what it missed.
            port_up(root, "mlx5_0", 1)

            async def resolved() -> bool:
                query = {**params, "status": "resolved"}
                return bool((await http.get("/api/v1/alerts", params=query)).json()["items"])

            await wait_until(resolved, what="resolved in the API")
            resumed: list[dict[str, str]] = []
            headers = {"Last-Event-ID": fired["id"]}
            async with (
                http.stream(
                    "GET", "/api/v1/alerts/stream", params=params, headers=headers
                ) as response,
                asyncio.TaskGroup() as tasks,
            ):
                reader = tasks.create_task(read_events(response, resumed))
                await wait_until(lambda: len(resumed) >= 1, what="replayed event")
                reader.cancel()
            assert resumed[0]["event"] == "alert"
            assert int(resumed[0]["id"]) > int(fired["id"])
            assert json.loads(resumed[0]["data"])["state"] == "resolved"

            # A too-old id: full resync of what fires now (nothing).
            stale: list[dict[str, str]] = []
            async with (
                http.stream(
                    "GET", "/api/v1/alerts/stream", params=params, headers={"Last-Event-ID": "1"}
                ) as response,
                asyncio.TaskGroup() as tasks,
            ):
                reader = tasks.create_task(read_events(response, stale))
                await wait_until(lambda: len(stale) >= 1, what="resync")
                reader.cancel()
            assert stale[0]["event"] == "resync"


@pytest.mark.parametrize(
    ("path", "query", "headers", "field"),
    [
        pytest.param("/api/v1/alerts", {"status": "pending"}, {}, "status", id="bad-status"),
        pytest.param("/api/v1/alerts", {"severity": "fatal"}, {}, "severity", id="bad-severity"),
        pytest.param("/api/v1/alerts", {"node": "Bad_Node"}, {}, "node", id="bad-node"),
        pytest.param("/api/v1/findings", {"rule": "no such"}, {}, "rule", id="bad-rule"),
        pytest.param("/api/v1/findings", {"status": "firing"}, {}, "status", id="unknown-param"),
        pytest.param(
            "/api/v1/alerts/stream", {}, {"Last-Event-ID": "x1"}, "Last-Event-ID", id="bad-id"
        ),
    ],
)
async def test_bad_queries_name_the_field(
    nats_server: NatsServer, path: str, query: dict[str, str], headers: dict[str, str], field: str
) -> None:
    async with (
        aggregator(nats_server.url) as agg,
        httpx.AsyncClient(base_url=agg.api_url or "") as http,
    ):
        response = await http.get(path, params=query, headers=headers)
        assert response.status_code == 400
        assert response.json()["error"]["field"] == field
        assert (await http.get("/api/v1/alerts")).status_code == 200  # still serving


async def test_restart_keeps_firing_alert_without_renotify(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    node = "alert-restart-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    async with (
        subscriber(nats_server.url, f"nicfleet.v1.alert.*.*.{node}") as (nc, (inbox,)),
        agent(nats_server.url, root, node),
    ):
        async with aggregator(nats_server.url) as first:
            await wait_until(lambda: node in first.fleet, what="node in fleet")
            port_down(root, "mlx5_0", 1)
            await wait_until(lambda: states(inbox, node, "mlx5_0/1") == ["firing"], what="fire")
            assert first.alerts is not None
            (started,) = [
                a.starts_at
                for a in first.alerts.firing()
                if (a.node, a.subject) == (node, "mlx5_0/1")
            ]
            # The restarted process rebuilds the fleet from KV: wait for the DOWN snapshot there.
            kv = await nc.jetstream().key_value(subjects.KV_NODES)

            async def stored_down() -> bool:
                entry = await kv.get(subjects.node_token(node))
                stored = decode(entry.value or b"", StoredNode)
                return stored.snapshot.devices[0].ports[0].state == "DOWN"

            await wait_until(stored_down, what="DOWN snapshot in KV")
        async with aggregator(nats_server.url) as second:
            engine = second.alerts
            assert engine is not None
            mine = [a.starts_at for a in engine.firing() if a.node == node]
            assert started in mine

            def evaluated_with_finding() -> bool:
                return any(f.node == node for f in engine.findings)

            await wait_until(evaluated_with_finding, what="second aggregator evaluated")
            await wait_until(lambda: node in second.fleet and second.fleet.get(node) is not None)
            port_up(root, "mlx5_0", 1)
            await wait_until(
                lambda: states(inbox, node, "mlx5_0/1") == ["firing", "resolved"],
                what="resolve after restart",
            )
            await nc.flush()
            # Exactly one firing (from the first process), never a second one.
            assert states(inbox, node, "mlx5_0/1") == ["firing", "resolved"]


async def test_critical_alerts_become_node_events_in_the_cluster() -> None:
    """The EventSink wired to aggregator.kube.client, against kmock's emulated API server."""
    events_path = "v1/events"
    emulator = kmock.KubernetesEmulator()
    emulator.resources[events_path] = kmock.ResourceInfo(kind="Event", namespaced=True)
    down = Finding(
        rule="port-down", severity="critical", node="gpu-7", subject="mlx5_3/1",
        message="mlx5_3/1 is DOWN.",
    )  # fmt: skip
    warning = Finding(
        rule="fw-skew", severity="warning", node="gpu-7", subject="mlx5_3", message="m"
    )
    current = [down, warning]
    async with emulator, kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            engine = AlertEngine(
                fleet=Fleet(), changes=ChangeFeed().subscribe(), evaluate=lambda *_: current,
                policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
                metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
                events=NodeEvents(client),
            )  # fmt: skip

            def reasons() -> list[str]:
                return sorted(
                    o["reason"] for (r, _, _), o in emulator.objects.items() if r == events_path
                )

            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(engine.run(stop))
                await wait_until(lambda: reasons() == ["NicfleetAlertFiring"], what="event")
                current = [warning]
                await engine.cycle("test")
                await wait_until(
                    lambda: reasons() == ["NicfleetAlertFiring", "NicfleetAlertResolved"],
                    what="resolved event",
                )
                stop.set()
    events = [o for (r, _, _), o in emulator.objects.items() if r == events_path]
    firing = next(e for e in events if e["reason"] == "NicfleetAlertFiring")
    assert firing["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-7"}
    assert firing["type"] == "Warning" and "mlx5_3/1" in firing["message"]
