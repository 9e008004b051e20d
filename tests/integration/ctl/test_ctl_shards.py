"""`nicfleetctl nodes` / `findings` against sharded replicas (docs/scaling.md): each replica
lists its own share, so the CLI reads the list from every replica `/api/v1/shards` names
and merges it; a replica it cannot read is named and the command exits 1. Real API apps
(nodes, findings and shard routes) on 127.0.0.1; the ShardOwners are never started, their
plan and peers' URLs are set by the test."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import nats
import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.shards import add_shard_routes
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.ctl.main import cli
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.replicas.owner import ShardOwner
from aggregator.replicas.partitions import ShardSettings
from aggregator.rules.finding import Finding
from proto.policy import Policy
from tests.support.builders import T0, snapshot

pytestmark = pytest.mark.integration

P = 12


def finding(rule: str, severity: str, node: str | None, subject: str) -> Finding:
    return Finding(rule=rule, severity=severity, node=node, subject=subject,  # type: ignore[arg-type]
                   message=f"{rule} on {subject}.")  # fmt: skip


@dataclass
class Replica:
    name: str
    nodes: tuple[str, ...]
    findings: tuple[Finding, ...] = ()

    def fleet(self) -> Fleet:
        fleet = Fleet()
        for node in self.nodes:
            fleet.apply_snapshot(snapshot(node), T0)
        return fleet

    def rules(
        self, fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return self.findings


@asynccontextmanager
async def served(replica: Replica) -> AsyncIterator[tuple[ShardOwner, str]]:
    fleet = replica.fleet()
    owner = ShardOwner(
        nats.NATS(), ShardSettings(partitions=P), identity=replica.name, fleet=fleet,
        nodes_kv=None,  # type: ignore[arg-type]
        handle=lambda _s, _d: True, on_change=lambda _n, _k: None, resync=lambda _p: None,
        clock=lambda: T0,
    )  # fmt: skip
    engine = AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=replica.rules,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=lambda: T0,
    )  # fmt: skip
    await engine.cycle("test")
    app = build_app(fleet=fleet, settings=ApiSettings(), readiness=lambda: (True, "ok"),
                    clock=lambda: T0)  # fmt: skip
    add_alert_routes(app, engine=engine)
    add_shard_routes(app, owner, fleet, lambda: ())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield owner, f"http://{host}:{port}"
    finally:
        engine.broker.close()
        await runner.cleanup()


async def ctl(*args: str) -> Result:
    """The CLI in a thread: its synchronous HTTP calls reach the servers on this loop."""
    env = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return await asyncio.to_thread(
        CliRunner().invoke, cli, list(args), env=env, prog_name="nicfleetctl"
    )


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


A = Replica("agg-a", ("gpu-001", "gpu-003", "gpu-005"),
            (finding("port-down", "critical", "gpu-003", "mlx5_0/1"),
             finding("driver-skew", "warning", None, "mlx5_core")))  # fmt: skip
# gpu-005 too: its partition changing hands, listed by both for up to a heartbeat.
B = Replica("agg-b", ("gpu-002", "gpu-004", "gpu-005"),
            (finding("fw-skew", "warning", "gpu-002", "mlx5_1"),
             finding("port-down", "critical", "gpu-004", "mlx5_0/1")))  # fmt: skip


async def test_lists_span_every_replica_each_item_once_in_the_apis_order() -> None:
    async with served(A) as (a, url_a), served(B) as (b, url_b):
        for owner in (a, b):
            owner.live = frozenset({"agg-a", "agg-b"})
            owner.api_urls.update({"agg-a": url_a, "agg-b": url_b})
        result = await ctl("--server", url_a, "nodes")
        assert result.exit_code == 0, result.output
        names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
        assert names == ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005"]

        body = json.loads((await ctl("--server", url_b, "nodes", "-o", "json")).stdout)
        assert (body["count"], body["replicas"], body["missing"]) == (5, ["agg-a", "agg-b"], [])

        result = await ctl("--server", url_b, "findings", "-o", "json")
        assert result.exit_code == 0, result.output
        order = [(f["severity"], f["node"], f["rule"]) for f in json.loads(result.stdout)["items"]]
        assert order == [  # most severe first, then node ("" for fleet-wide), rule, subject
            ("critical", "gpu-003", "port-down"),
            ("critical", "gpu-004", "port-down"),
            ("warning", None, "driver-skew"),
            ("warning", "gpu-002", "fw-skew"),
        ]
        result = await ctl("--server", url_a, "findings", "--severity", "critical")
        assert result.exit_code == 0, result.output
        assert "gpu-003" in result.stdout and "gpu-004" in result.stdout
        assert "gpu-002" not in result.stdout  # the filter went to every replica

        result = await ctl("--server", url_a, "alerts", "-o", "json")
        assert result.exit_code == 0, result.output
        alerts = [(a["severity"], a["node"], a["rule"]) for a in json.loads(result.stdout)["items"]]
        assert alerts == [  # firing first, most severe first, then node, rule, subject
            ("critical", "gpu-003", "port-down"),
            ("critical", "gpu-004", "port-down"),
            ("warning", "_fleet", "driver-skew"),
            ("warning", "gpu-002", "fw-skew"),
        ]
        table = (await ctl("--server", url_b, "alerts")).stdout
        assert "gpu-003" in table and "gpu-004" in table


async def test_a_replica_that_cannot_be_read_is_named_and_the_exit_code_is_1() -> None:
    async with served(A) as (a, url_a):
        gone = closed_port_url()
        a.live = frozenset({"agg-a", "agg-b", "agg-c"})  # agg-c: no heartbeat with a URL yet
        a.api_urls.update({"agg-a": url_a, "agg-b": gone, "agg-dead": gone})  # not live
        result = await ctl("--server", url_a, "nodes")
        assert result.exit_code == 1, result.output
        names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
        assert names == ["gpu-001", "gpu-003", "gpu-005"]  # what could be read is shown
        assert f"agg-b ({gone})" in result.stderr and "cannot reach" in result.stderr.lower()
        assert "agg-c (no URL): its API URL is not known yet" in result.stderr
        assert "2 of 3 replicas" in result.stderr

        body = json.loads((await ctl("--server", url_a, "nodes", "-o", "json")).stdout)
        assert body["replicas"] == ["agg-a"]
        assert [(m["replica"], m["url"]) for m in body["missing"]] == [
            ("agg-b", gone), ("agg-c", None),
        ]  # fmt: skip
