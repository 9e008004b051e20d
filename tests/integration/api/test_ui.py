"""The status page at /ui/ in a real headless chromium (tests/support/cdp.py) against a
demo fleet on real parts — lab agents, nats-server, the aggregator: the fleet table, the
GPU x NIC matrix of the captured H100 node, an alert arriving over SSE after a port fault
without a reload, the trace chain, the token prompt, strings shown as text; plus the
static routes themselves. Screenshots go to $NICFLEET_TEST_ARTIFACTS or tests/artifacts/."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import msgspec
import nats
import pytest

from agent.host.topology import parse_topo_matrix
from agent.lab.faults import bump_counter, port_down
from aggregator.api.auth import load_token_file
from aggregator.api.statuspage import CONTENT_TYPES, load_files
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import encode
from proto.inventory import GpuNicRelation
from proto.messages.status import DevicePluginStatus, ResourceStatus
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.support.builders import device, snapshot
from tests.support.cdp import CHROMIUM, Page, open_page
from tests.support.paths import FIXTURES, REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
# In CI (`CI` set) a missing chromium fails the browser tests instead of skipping them.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Debian chromium is not installed (`apt-get install chromium`, or `make test` as root)",
)

ARTIFACTS = Path(os.environ.get("NICFLEET_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
H100_MATRIX = FIXTURES / "topology" / "nvidia_smi_topo_h100_12nic_2numa.txt"
IB_NODE, ROCE_NODE = "gpu-ib-01", "gpu-roce-01"
RESOURCE = "rdma/ib"
# Closest NIC with an ACTIVE port per GPU: the compute rail (mlx5_1/2 are down; mlx5_7/8
# are PIX to GPU4 too, but at 100 Gb/s against mlx5_6's 400).
BEST = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
READ_TOKEN = "ui-read-token-0123456789abcdef"
UI_DIR = REPO / "aggregator" / "api" / "ui"


@asynccontextmanager
async def aggregator(settings: AggregatorSettings) -> AsyncIterator[AggregatorService]:
    service = AggregatorService(settings)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), timeout=20)
        try:
            yield service
        finally:
            stop.set()


def settings(nats_url: str, **extra: object) -> AggregatorSettings:
    return AggregatorSettings(
        nats_url=nats_url,
        listen_host="127.0.0.1",
        listen_port=0,
        **extra,  # type: ignore[arg-type]
    )


async def publish(nats_url: str, node: str, kind: str, payload: bytes) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.publish(subjects.node_subject(node, kind), payload)
        await nc.flush()
    finally:
        await nc.close()


def plugin_status(
    node: str, devices: tuple[str, ...] = BEST, *, epoch: int = 0
) -> DevicePluginStatus:
    """What an agent's device plugin reports: rdma/ib on the eight compute NICs (or the
    given ones), as the agent process `epoch` (the aggregator follows one process per node:
    docs/wire.md, "Ordering")."""
    served = ResourceStatus(
        name=RESOURCE,
        advertised=8 * len(devices),
        healthy=8 * len(devices),
        devices=devices,
        registration="registered",
    )
    return DevicePluginStatus(
        node=node,
        config_generation=1,
        registered=True,
        resources=(served,),
        observed_at=time.time(),
        epoch=epoch,
    )


def artifact(name: str) -> Path:
    return ARTIFACTS / name


def spark(port: str, series: str) -> str:
    """JavaScript for the sparkline `series` (traffic|errors) of `port` in the ports table."""
    selector = f"#ports tr[data-port='{port}'] svg[data-series={series}]"
    return f"document.querySelector({json.dumps(selector)})"


async def no_page_errors(page: Page) -> None:
    assert page.exceptions == [], page.exceptions


async def rows(page: Page, selector: str, attribute: str) -> list[str]:
    return await page.evaluate(  # type: ignore[no-any-return]
        f"[...document.querySelectorAll({json.dumps(selector)})]"
        f".map(e => e.getAttribute({json.dumps(attribute)}))"
    )


@needs_chromium
async def test_fleet_matrix_live_alert_and_trace(own_nats: NatsServer, tmp_path: Path) -> None:
    ib_root = lab_node(tmp_path, "h100-ib-12nic", IB_NODE)
    roce_root = lab_node(tmp_path, "roce-cx6dx", ROCE_NODE)
    async with AsyncExitStack() as stack:
        agg = await stack.enter_async_context(aggregator(settings(own_nats.url)))
        ib_agent = await stack.enter_async_context(agent(own_nats.url, ib_root, IB_NODE))
        await stack.enter_async_context(agent(own_nats.url, roce_root, ROCE_NODE))
        await wait_until(lambda: {IB_NODE, ROCE_NODE} <= set(agg.fleet.names()), what="nodes")
        status = plugin_status(IB_NODE, epoch=ib_agent.epoch)
        await publish(own_nats.url, IB_NODE, subjects.STATUS, encode(status))
        await wait_until(
            lambda: (r := agg.fleet.get(IB_NODE)) is not None and r.device_plugin is not None,
            what="device-plugin status",
        )
        page = await stack.enter_async_context(open_page(tmp_path / "browser"))
        base = f"{agg.api_url}/ui/"

        # The fleet table: both nodes, ready, with their counts; the alert stream is live.
        await page.goto(base)
        await page.wait_for(
            "document.querySelectorAll('#fleet tbody tr[data-state=ready]').length === 2",
            what="two ready nodes in the fleet table",
        )
        assert await rows(page, "#fleet tbody tr", "data-node") == [IB_NODE, ROCE_NODE]
        ib_row = await page.evaluate(
            f"[...document.querySelector('#fleet tr[data-node={IB_NODE}]').cells]"
            ".map(c => c.textContent)"
        )
        assert ib_row[:5] == [IB_NODE, "ready", "8", "12", "10/12"]
        assert ib_row[5] == "mlx5_1/1, mlx5_2/1"
        await page.wait_for("document.querySelector('#live').dataset.state === 'live'")
        assert await rows(page, "#resources tbody tr", "data-resource") == [RESOURCE]
        await page.screenshot(artifact("ui-fleet.png"))

        # The node: the heatmap is the captured `nvidia-smi topo -m` matrix, best NICs marked.
        await page.evaluate(f"window.location.hash = '#/node/{IB_NODE}'")
        await page.wait_for(
            "document.querySelectorAll('#topology td[data-nic]').length === 96",
            what="8 x 12 matrix",
        )
        cells = await page.evaluate(
            "[...document.querySelectorAll('#topology td[data-nic]')]"
            ".map(td => [td.dataset.gpu, td.dataset.nic, td.dataset.rel, td.textContent])"
        )
        captured = parse_topo_matrix(H100_MATRIX.read_text())
        expected = {
            key: cell
            for key, cell in captured.items()
            if key[0].startswith("GPU") and key[1].startswith("mlx5_")
        }
        assert {(gpu, nic): rel for gpu, nic, rel, _ in cells} == expected
        assert all(text.startswith(rel) for _, _, rel, text in cells)  # shown as text too
        colors = await page.evaluate(
            "[...new Set([...document.querySelectorAll('#topology td[data-nic]')]"
            ".map(td => `${td.dataset.rel}=${getComputedStyle(td).backgroundColor}`))]"
        )
        assert len({c.split("=")[1] for c in colors}) == len(colors) == 3  # PIX, NODE, SYS
        best = await rows(page, "#topology td[data-best]", "data-nic")
        assert best == list(BEST)
        assert await rows(page, "#topology td[data-best]", "data-gpu") == [
            f"GPU{i}" for i in range(8)
        ]
        # GPUDirect and IOMMU from the API's `gpudirect`: an agent without --proc-root
        # reports no kernel release, so only peermem is known to work.
        gpudirect = await page.evaluate(
            "(({dataset, textContent}) => [dataset.path, dataset.iommu, textContent])"
            "(document.querySelector('#gpudirect'))"
        )
        assert gpudirect[:2] == ["peermem", "off"]
        assert "GPUDirect peermem (dma-buf: unknown" in gpudirect[2]
        # Ports with state, and sparklines from at least two polled counter batches.
        ports = await rows(page, "#ports tbody tr", "data-port")
        assert ports == [f"mlx5_{k}/1" for k in range(12)]
        # Traffic and errors between polls: the sparklines move, the error rate shows.
        traffic, errors = spark("mlx5_0/1", "traffic"), spark("mlx5_0/1", "errors")
        await page.wait_for(f"Number({traffic}.dataset.points) >= 1", what="a first rate")
        for words in (50_000_000, 150_000_000, 100_000_000, 200_000_000):
            points = await page.evaluate(f"Number({traffic}.dataset.points)")
            bump_counter(ib_root, "mlx5_0", 1, "port_xmit_data", words, atomic=False)
            await page.wait_for(f"Number({traffic}.dataset.points) > {points}", what="a sample")
        bump_counter(ib_root, "mlx5_0", 1, "symbol_error", 7, atomic=False)
        await page.wait_for(f"Number({traffic}.dataset.max) > 0", what="traffic in the sparkline")
        await page.wait_for(f"Number({errors}.dataset.max) > 0", what="errors in the sparkline")
        assert await rows(page, "#plugin tbody tr", "data-resource") == [RESOURCE]
        await page.screenshot(artifact("ui-node.png"))

        # A port fault: the alert row appears without a reload (the marker survives).
        await page.evaluate("window.__noReload = 'still here'")
        alert_row = (
            f"#alerts tr[data-rule=port-down][data-node={IB_NODE}][data-subject='mlx5_3/1']"
            "[data-state=firing]"
        )
        assert not await page.evaluate(f"!!document.querySelector({json.dumps(alert_row)})")
        port_down(ib_root, "mlx5_3", 1)
        await page.wait_for(
            f"!!document.querySelector({json.dumps(alert_row)})", what="port-down alert via SSE"
        )
        assert await page.evaluate("window.__noReload") == "still here"
        # GPU1's own NIC is down: its best is now the closest NIC still up.
        gpu1_best = "document.querySelector('#topology td[data-gpu=GPU1][data-best]')?.dataset.nic"
        assert await page.wait_for(f"{gpu1_best} !== 'mlx5_3' && {gpu1_best}") == "mlx5_0"
        await page.wait_for(
            "document.querySelector('#ports tr[data-port=\"mlx5_3/1\"]').dataset.state === 'DOWN'",
            what="mlx5_3/1 DOWN in the ports table",
        )
        assert await page.evaluate("document.querySelector('#alerts-count').textContent") != "0"
        await page.screenshot(artifact("ui-alert.png"))
        await page.screenshot(artifact("ui-topology.png"), "#topology")

        # The trace: the API's links in its order and statuses, green and red. The resource
        # narrowed to the faulted adapter (one resource per rail), so the chain breaks.
        narrowed = plugin_status(IB_NODE, ("mlx5_3",), epoch=ib_agent.epoch)
        await publish(own_nats.url, IB_NODE, subjects.STATUS, encode(narrowed))
        await wait_until(
            lambda: (
                (r := agg.fleet.get(IB_NODE)) is not None
                and r.device_plugin is not None
                and r.device_plugin.resources[0].devices == ("mlx5_3",)
            ),
            what="the narrowed device-plugin status",
        )
        await page.evaluate(f"window.location.hash = '#/trace/{IB_NODE}/rdma%2Fib'")
        await page.wait_for(
            "document.querySelectorAll('#chain li[data-link]').length > 0", what="the chain"
        )
        async with httpx.AsyncClient(base_url=agg.api_url or "") as http:
            trace = (
                await http.get("/api/v1/trace", params={"node": IB_NODE, "resource": RESOURCE})
            ).json()
        shown = await page.evaluate(
            "[...document.querySelectorAll('#chain li[data-link]')]"
            ".map(li => [li.dataset.link, li.dataset.status, li.className])"
        )
        assert [(name, status) for name, status, _ in shown] == [
            (link["name"], link["status"]) for link in trace["links"]
        ]
        assert all(cls == f"link {status}" for _, status, cls in shown)
        statuses = {status for _, status, _ in shown}
        assert {"ok", "broken"} <= statuses
        await page.screenshot(artifact("ui-trace.png"))
        await no_page_errors(page)


@needs_chromium
async def test_token_prompt_then_the_page_loads(own_nats: NatsServer, tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"read {READ_TOKEN}\n")
    auth = load_token_file(token_file)
    async with (
        aggregator(settings(own_nats.url, api_auth=auth)) as agg,
        open_page(tmp_path / "browser") as page,
    ):
        await page.goto(f"{agg.api_url}/ui/")
        await page.wait_for("document.querySelector('#token-dialog').open", what="token prompt")
        await page.screenshot(artifact("ui-token.png"))
        # A wrong token: refused, asked again with the reason.
        await page.type_text("#token-input", "wrong-token-0123456789")
        await page.evaluate("document.querySelector('#token-form button').click()")
        await page.wait_for(
            "document.querySelector('#token-dialog').open"
            " && !document.querySelector('#token-error').hidden",
            what="the prompt again, saying the token was refused",
        )
        await page.type_text("#token-input", READ_TOKEN)
        await page.evaluate("document.querySelector('#token-form button').click()")
        await page.wait_for("!!document.querySelector('#fleet-empty')", what="the (empty) fleet")
        await page.wait_for("document.querySelector('#live').dataset.state === 'live'")
        assert not await page.evaluate("document.querySelector('#token-dialog').open")
        assert READ_TOKEN not in await page.evaluate("window.location.href")
        assert await page.evaluate("sessionStorage.getItem('nicfleet.token')") == READ_TOKEN
        await no_page_errors(page)


@needs_chromium
async def test_strings_from_the_api_are_text_never_markup(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "odd-01"
    evil = '<img src=x onerror="window.__xss=1">'
    base = snapshot(node, collected_at=time.time(), devices=(device(evil, netdev="<b>ib0</b>"),))
    gpu = base.gpus[0]
    odd = msgspec.structs.replace(
        base,
        gpus=(gpu,),
        gpu_nic_topology=(GpuNicRelation(gpu=gpu.pci_address, nic=evil, relation="PIX"),),
    )
    async with (
        aggregator(settings(own_nats.url)) as agg,
        open_page(tmp_path / "browser") as page,
    ):
        await publish(own_nats.url, node, subjects.SNAPSHOT, encode(odd))
        await wait_until(lambda: node in agg.fleet, what="odd node")
        await page.goto(f"{agg.api_url}/ui/#/node/{node}")
        header = await page.wait_for(
            "document.querySelector('#topology thead th:nth-child(2)')?.textContent"
        )
        assert header == evil
        assert await rows(page, "#ports tbody tr", "data-port") == [f"{evil}/1"]
        assert await page.evaluate("document.querySelectorAll('#view img, #view b').length") == 0
        assert await page.evaluate("window.__xss") is None
        # An unknown node: the API's message and its close names as links.
        await page.evaluate("window.location.hash = '#/node/odd-1'")
        suggested = await page.wait_for(
            "[...document.querySelectorAll('#problem a')].map(a => a.getAttribute('href'))"
            ".join() || ''"
        )
        assert suggested == f"#/node/{node}"
        assert "not found" in await page.evaluate("document.querySelector('#problem').textContent")
        await no_page_errors(page)


async def test_static_routes_are_open_typed_and_out_of_the_openapi_document(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"read {READ_TOKEN}\n")
    auth = load_token_file(token_file)
    async with (
        aggregator(settings(own_nats.url, api_auth=auth)) as agg,
        httpx.AsyncClient(base_url=agg.api_url or "") as http,
    ):
        for bare in ("/ui", "/"):  # the API's bare address in a browser opens the page
            moved = await http.get(bare)
            assert (moved.status_code, moved.headers["location"]) == (302, "/ui/"), bare
        page = await http.get("/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        for name in sorted(load_files()):
            served = await http.get(f"/ui/{name}")
            assert served.status_code == 200, name
            assert served.content == (UI_DIR / name).read_bytes()
            suffix = "." + name.rpartition(".")[2]
            assert served.headers["content-type"] == CONTENT_TYPES[suffix]
        # Unknown names are a JSON 404; nothing deeper than /ui/<name> is open.
        missing = await http.get("/ui/nope.js")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        for path in ("/ui/x/app.js", "/api/v1/nodes", "/ui2/"):
            refused = await http.get(path)
            assert refused.status_code == 401, path
        # The data still needs the token; the OpenAPI document leaves the page out.
        headers = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert (await http.get("/api/v1/nodes", headers=headers)).status_code == 200
        doc = (await http.get("/api/v1/openapi.json", headers=headers)).json()
        assert "/api/v1/nodes" in doc["paths"]
        assert not [p for p in doc["paths"] if p.startswith("/ui")]


MARKUP_SINKS = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(")


def test_page_code_never_parses_strings_as_markup() -> None:
    """The escaping rule, checked on the source: no HTML sinks, no inline script or style."""
    scripts = sorted(UI_DIR.glob("*.js"))
    assert scripts
    for script in scripts:
        assert not MARKUP_SINKS.search(script.read_text()), script.name
    index = (UI_DIR / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", index) == ['<script type="module" src="app.js">']
    assert not re.search(r"\son\w+\s*=", index)  # no inline handlers (onclick=...)
    assert "style=" not in index
    for module in re.findall(r'from "\./([\w.]+)"', " ".join(s.read_text() for s in scripts)):
        assert (UI_DIR / module).is_file(), module
