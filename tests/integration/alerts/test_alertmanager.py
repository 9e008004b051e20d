"""Alerts into the real Alertmanager (Debian `prometheus-alertmanager`, loopback only):
fire and resolve through its v2 API and a webhook receiver; failures are counted."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from agent.lab.faults import port_down, port_up
from aggregator.alerts.alertmanager import AlertmanagerSettings, AlertmanagerSink, to_postable
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.wiring import AlertWiring
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService, AggregatorSettings
from proto.messages.alerts import Alert
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Webhook:
    """Alertmanager's webhook receiver: every notification it sends, as JSON."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.notifications.append(await request.json())
        return web.Response()

    def statuses(self, subject: str) -> list[str]:
        return [
            alert["status"]
            for note in self.notifications
            for alert in note["alerts"]
            if alert["labels"].get("subject") == subject
        ]


@asynccontextmanager
async def webhook() -> AsyncIterator[tuple[Webhook, str]]:
    hook = Webhook()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield hook, f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


@pytest.fixture
def alertmanager_factory(tmp_path: Path) -> Iterator[Any]:
    if BINARY is None:
        pytest.skip(
            "prometheus-alertmanager is not installed "
            "(apt-get install -y --no-install-recommends prometheus-alertmanager)"
        )
    procs: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "alertmanager.log").open("wb")

    def start(hook_url: str) -> str:
        port = free_port()
        config = tmp_path / "alertmanager.yml"
        config.write_text(
            "route:\n  receiver: hook\n  group_by: ['...']\n  group_wait: 0s\n"
            "  group_interval: 1s\n  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n"
            f"      - url: {hook_url}\n        send_resolved: true\n"
        )
        assert BINARY is not None
        procs.append(
            subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={config}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        )
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)
    log.close()


async def am_ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/-/ready")).status_code == 200
    except httpx.HTTPError:
        return False


async def am_alerts(url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        body: list[dict[str, Any]] = (await http.get(f"{url}/api/v2/alerts")).json()
        return body


async def test_alertmanager_receives_fire_and_resolve(
    nats_server: NatsServer, tmp_path: Path, alertmanager_factory: Any
) -> None:
    node = "am-ib-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    async with webhook() as (hook, hook_url):
        am_url = alertmanager_factory(hook_url)
        await wait_until(lambda: am_ready(am_url), timeout=20, what="Alertmanager ready")
        settings = AggregatorSettings(
            nats_url=nats_server.url,
            listen_port=0,
            alerts=AlertWiring(alertmanager=AlertmanagerSettings(url=am_url)),
        )
        service = AggregatorService(settings)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), timeout=15)
                async with agent(nats_server.url, root, node):
                    await wait_until(lambda: node in service.fleet, what="node in fleet")
                    port_down(root, "mlx5_0", 1)

                    async def listed() -> list[dict[str, Any]]:
                        return [
                            a
                            for a in await am_alerts(am_url)
                            if a["labels"].get("node") == node
                            and a["labels"].get("subject") == "mlx5_0/1"
                        ]

                    await wait_until(lambda: _nonempty(listed()), what="alert in Alertmanager")
                    (alert,) = await listed()
                    assert alert["labels"] == {
                        "alertname": "port-down",
                        "rule": "port-down",
                        "severity": "critical",
                        "node": node,
                        "subject": "mlx5_0/1",
                    }
                    assert "mlx5_0/1" in alert["annotations"]["summary"]
                    assert alert["annotations"]["runbook"].endswith("rules.md#port-down")
                    assert alert["status"]["state"] == "active"
                    await wait_until(
                        lambda: "firing" in hook.statuses("mlx5_0/1"), what="firing notification"
                    )
                    port_up(root, "mlx5_0", 1)
                    await wait_until(
                        lambda: "resolved" in hook.statuses("mlx5_0/1"),
                        what="resolved notification",
                    )
                    assert await listed() == []  # Alertmanager lists only unresolved alerts
            finally:
                stop.set()


async def _nonempty(items: Any) -> bool:
    return bool(await items)


def alert(state: str = "firing") -> Alert:
    return Alert(
        rule="port-down", severity="critical", state=state, node="n-1", subject="mlx5_0/1",  # type: ignore[arg-type]
        message="down", starts_at=1000.0, ends_at=1010.0 if state == "resolved" else None,
        fingerprint="f" * 32,
    )  # fmt: skip


def test_postable_alert_shape() -> None:
    firing = to_postable(alert(), "https://x/docs/rules.md", now=2000.0)
    assert firing["startsAt"] == "1970-01-01T00:16:40Z" and "endsAt" not in firing
    assert firing["annotations"] == {
        "summary": "down",
        "runbook": "https://x/docs/rules.md#port-down",
    }
    resolved = to_postable(alert("resolved"), "r", now=2000.0)
    assert resolved["endsAt"] == "1970-01-01T00:16:50Z"


async def test_unreachable_alertmanager_is_retried_counted_and_never_blocks() -> None:
    registry = CollectorRegistry()
    metrics = AlertMetrics.create(registry)
    sink = AlertmanagerSink(
        AlertmanagerSettings(url=f"http://127.0.0.1:{free_port()}", attempts=2, backoff_s=0.01),
        firing=lambda: [],
        metrics=metrics,
        clock=lambda: 0.0,
    )
    sink.submit([alert("resolved")])  # synchronous: the engine never waits for HTTP

    def failed() -> float:
        return (
            registry.get_sample_value("nicfleet_alertmanager_posts_total", {"result": "failed"})
            or 0
        )

    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(sink.run(stop))
        await wait_until(lambda: failed() >= 1, what="failed post counted")
        stop.set()
    retries = registry.get_sample_value("nicfleet_alertmanager_posts_total", {"result": "retry"})
    assert retries == 2


async def test_firing_alerts_are_resent_periodically(alertmanager_factory: Any) -> None:
    am_url = alertmanager_factory("http://127.0.0.1:9/unused")
    await wait_until(lambda: am_ready(am_url), timeout=20, what="Alertmanager ready")
    registry = CollectorRegistry()
    sink = AlertmanagerSink(
        AlertmanagerSettings(url=am_url, resend_s=0.05),
        firing=lambda: [alert()],
        metrics=AlertMetrics.create(registry),
        clock=time.time,
    )

    def posted() -> float:
        return registry.get_sample_value("nicfleet_alertmanager_posts_total", {"result": "ok"}) or 0

    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(sink.run(stop))
        await wait_until(lambda: posted() >= 3, what="three re-sends")
        stop.set()
    assert [a["labels"]["node"] for a in await am_alerts(am_url)] == ["n-1"]
