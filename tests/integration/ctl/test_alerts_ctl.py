"""`nicfleetctl findings` / `alerts [--follow]` against the real alert routes on 127.0.0.1,
driven by an AlertEngine fed hand-made findings (no NATS needed)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.api.alerts import StreamSettings, add_alert_routes
from aggregator.api.errors import BadParameter, error_response
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.ctl.main import cli
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.finding import Finding
from proto.policy import Policy
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration


def finding(rule: str, severity: str, node: str | None, subject: str) -> Finding:
    return Finding(
        rule=rule, severity=severity, node=node, subject=subject,  # type: ignore[arg-type]
        message=f"{rule} on {subject}.", evidence={"state": "DOWN"},
    )  # fmt: skip


@dataclass
class Rules:
    """A stand-in rule set whose findings the test sets."""

    findings: list[Finding] = field(default_factory=list)

    def __call__(
        self, fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return self.findings


@asynccontextmanager
async def served(rules: Rules) -> AsyncIterator[tuple[AlertEngine, str]]:
    clock = iter(range(1_800_000_000, 1_900_000_000))
    engine = AlertEngine(
        fleet=Fleet(),
        changes=ChangeFeed().subscribe(),
        evaluate=rules,
        policies=lambda: (),
        cluster=lambda: NO_CLUSTER,
        settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()),
        broker=Broker(first_id=1),
        clock=lambda: float(next(clock)),
    )

    @web.middleware
    async def errors(request: web.Request, handler: object) -> web.StreamResponse:
        try:
            return await handler(request)  # type: ignore[operator,no-any-return]
        except BadParameter as exc:
            return error_response(400, "bad_request", exc.message, field=exc.field)

    app = web.Application(middlewares=[errors])
    add_alert_routes(app, engine=engine, settings=StreamSettings(heartbeat_s=0.2))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield engine, f"http://{host}:{port}"
    finally:
        engine.broker.close()
        await runner.cleanup()


def ctl(*args: str) -> Result:
    env = {"NICFLEET_SERVER": None, "NO_COLOR": "1"}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="nicfleetctl")


FINDINGS = [
    finding("port-down", "critical", "node-1", "mlx5_0/1"),
    finding("fw-skew", "warning", "node-2", "mlx5_1"),
    finding("driver-skew", "warning", None, "mlx5_core"),
]


async def test_findings_and_alerts_tables_json_and_filters() -> None:
    rules = Rules(list(FINDINGS))
    async with served(rules) as (engine, url):
        await engine.cycle("test")
        result = await asyncio.to_thread(ctl, "--server", url, "findings")
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[0].split() == ["SEVERITY", "RULE", "NODE", "SUBJECT", "MESSAGE"]
        assert [line.split()[:3] for line in lines[1:]] == [
            ["critical", "port-down", "node-1"],
            ["warning", "driver-skew", "_fleet"],
            ["warning", "fw-skew", "node-2"],
        ]
        wide = await asyncio.to_thread(ctl, "--server", url, "findings", "-o", "wide")
        assert "state=DOWN" in wide.stdout
        only = await asyncio.to_thread(
            ctl, "--server", url, "findings", "--severity", "critical", "-o", "json"
        )
        body = json.loads(only.stdout)
        assert [f["rule"] for f in body["items"]] == ["port-down"]

        rules.findings = FINDINGS[1:]
        await engine.cycle("test")  # port-down resolves
        result = await asyncio.to_thread(ctl, "--server", url, "alerts")
        assert result.exit_code == 0, result.output
        rows = [line.split()[:4] for line in result.stdout.splitlines()[1:]]
        assert rows == [
            ["firing", "warning", "driver-skew", "_fleet"],
            ["firing", "warning", "fw-skew", "node-2"],
            ["resolved", "critical", "port-down", "node-1"],
        ]
        resolved = await asyncio.to_thread(
            ctl, "--server", url, "alerts", "--status", "resolved", "-o", "json"
        )
        assert [a["subject"] for a in json.loads(resolved.stdout)["items"]] == ["mlx5_0/1"]
        none = await asyncio.to_thread(ctl, "--server", url, "alerts", "--node", "node-1",
                                       "--severity", "info")  # fmt: skip
        assert none.exit_code == 0 and "No alerts." in none.stderr


async def test_bad_input_and_unreachable_exit_codes() -> None:
    async with served(Rules()) as (_, url):
        bad_node = await asyncio.to_thread(ctl, "--server", url, "alerts", "--node", "Bad_Node")
        assert bad_node.exit_code == 2 and "DNS-1123" in bad_node.output
        bad_rule = await asyncio.to_thread(ctl, "--server", url, "findings", "--rule", "a b")
        assert bad_rule.exit_code == 2
        bad_severity = await asyncio.to_thread(ctl, "--server", url, "alerts", "--severity", "x")
        assert bad_severity.exit_code == 2
        both = await asyncio.to_thread(ctl, "--server", url, "alerts", "-f", "--status", "firing")
        assert both.exit_code == 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for args in (("alerts",), ("findings",), ("alerts", "--follow")):
        result = await asyncio.to_thread(ctl, "--server", closed, *args)
        assert result.exit_code == 3, (args, result.output)


async def test_follow_streams_transitions_and_ctrl_c_exits_0() -> None:
    rules = Rules([FINDINGS[0]])
    async with served(rules) as (engine, url):
        await engine.cycle("test")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aggregator.ctl", "--server", url,
            "alerts", "--follow", "--node", "node-1", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            assert (first["rule"], first["state"]) == ("port-down", "firing")  # current state
            await wait_until(lambda: engine.broker.clients == 1, what="follower connected")
            rules.findings = [FINDINGS[1], finding("port-down", "critical", "node-1", "mlx5_2/1")]
            await engine.cycle("test")
            lines = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 20)) for _ in "ab"]
            # node-2's fw-skew is filtered out; the resolve and the new port follow in order.
            assert [(a["subject"], a["state"]) for a in lines] == [
                ("mlx5_0/1", "resolved"),
                ("mlx5_2/1", "firing"),
            ]
        finally:
            proc.send_signal(signal.SIGINT)
            code = await asyncio.wait_for(proc.wait(), 20)
        assert code == 0
