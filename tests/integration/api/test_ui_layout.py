"""The status page's layout in a real headless chromium (tests/support/cdp.py): every view
at a common laptop width and a narrow one has no horizontal overflow (the page, the cards,
the tables), wraps names only at sensible points (never "port-" / "down"), and draws the
trace's arrows only between boxes on one row; the alerts panel filters by words and
severity and groups skew alerts (on the lab fleet, and on a small fake API serving both
shapes a skew rule may take); `/` leads to the page; a trace address takes the resource
unencoded. With NICFLEET_DOCS_SCREENSHOTS=1 it also rewrites the screenshots docs/ui.md
shows (never otherwise, so a test run does not touch tracked files)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from agent.lab.faults import port_down
from aggregator.alerts.engine import EngineSettings
from aggregator.alerts.wiring import AlertWiring
from aggregator.api.statuspage import add_ui_routes
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import encode
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.api.test_ui import (
    IB_NODE,
    RESOURCE,
    ROCE_NODE,
    aggregator,
    artifact,
    needs_chromium,
    no_page_errors,
    plugin_status,
    publish,
    rows,
    settings,
)
from tests.support.cdp import Page, open_page
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

# A common laptop screen (1366x768) and a narrow window (half of one, or a tablet).
WIDTHS = {"laptop": (1366, 768), "narrow": (700, 900)}
DOCS = REPO / "docs"
WRITE_DOCS = os.environ.get("NICFLEET_DOCS_SCREENSHOTS") == "1"

# Elements that must not be wider than their box, and the cards whose edges nothing outside
# a sideways-scrolling box may cross. Scroll boxes (.table-box, .scroll) are listed apart:
# they are the one place a too-wide table may go, and the test says which may use it.
OVERFLOW_JS = """(() => {
  const wide = (el) => el.scrollWidth > el.clientWidth + 1;
  const label = (el) => el.id ? `#${el.id}` : `${el.tagName.toLowerCase()}.${el.className}`;
  const boxes = [document.documentElement, document.body,
    ...document.querySelectorAll("main, aside, .chain .link, #components")];
  const overflowing = boxes.filter(wide).map(label);
  for (const card of document.querySelectorAll("main, aside")) {
    const edge = card.getBoundingClientRect();
    for (const el of card.querySelectorAll("*")) {
      if (el.closest(".table-box, .scroll") || el.closest("dialog")) continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.right > edge.right + 0.5 || r.left < edge.left - 0.5) overflowing.push(label(el));
    }
  }
  const scrolling = [...document.querySelectorAll(".table-box, .scroll")].filter(wide)
    .map((box) => box.querySelector("table")?.id || label(box));
  return { overflowing, scrolling };
})()"""

# Every line break inside the page's names, cells and titles: the character before it must
# be a space or one of . _ / : , ; (a '-' too inside a sentence, anything inside a run
# marked long). Measured per character with Range rects, so it checks what is drawn.
WRAPS_JS = """(() => {
  const fine = /[\\s._\\/:,;]/;
  const bad = [];
  const cells = document.querySelectorAll(
    "#view td, #view th, #view h1, #alerts td, #crumbs, .chain .title");
  for (const el of cells) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let top = null, before = "", where = null;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const parent = node.parentElement;
      const inProse = !!parent.closest(".prose"), inLong = !!parent.closest(".long");
      if (getComputedStyle(parent).display !== "inline") before = " ";  // a box of its own
      for (let i = 0; i < node.length; i += 1) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        if (rect && rect.width > 0) {
          if (top !== null && rect.top > top + 2 && !fine.test(before)
              && !(inProse && before === "-") && !(inLong && where === parent)) {
            const text = JSON.stringify(el.textContent.slice(0, 60));
            bad.push(`${text} breaks after ${JSON.stringify(before)}`);
          }
          top = rect.top;
        }
        before = node.data[i];
        where = parent;
      }
    }
  }
  return bad;
})()"""

# Per box of the chain: [link name, arrow before it, arrow after it, whether the box
# before it is on the same row]. Arrows are pseudo-elements, wherever the CSS puts them.
ARROWS_JS = """[...document.querySelectorAll('#chain > li')].map((li) => {
  const shows = (which) => !['none', 'normal', ''].includes(getComputedStyle(li, which).content);
  const prev = li.previousElementSibling;
  return [li.dataset.link, shows('::before'), shows('::after'),
    !!prev && Math.abs(prev.getBoundingClientRect().top - li.getBoundingClientRect().top) < 2];
})"""


def dangling(arrows: list[tuple[str, bool, bool, bool]]) -> list[str]:
    """The gaps whose arrows are wrong: one arrow between neighbours on a row, none where
    a row ends (after the last box either), none before a row's first box."""
    wrong = []
    for index, (name, before, _, same_row) in enumerate(arrows):
        after_previous = index > 0 and arrows[index - 1][2]
        if before + after_previous != same_row:
            wrong.append(f"before {name}")
    if arrows and arrows[-1][2]:
        wrong.append(f"after the last box, {arrows[-1][0]}")
    return wrong


def shots(name: str) -> Iterator[Path]:
    """Where a screenshot goes: the artifacts always, docs/ only when asked."""
    yield artifact(f"docs-{name}")
    if WRITE_DOCS:
        yield DOCS / name


async def screenshot(page: Page, name: str, selector: str | None = None) -> None:
    for path in shots(name):
        await page.screenshot(path, selector)


async def show(page: Page, hash_: str, ready: str) -> None:
    await page.evaluate(f"window.location.hash = {json.dumps(hash_)}")
    await page.wait_for(ready, what=f"{hash_} drawn")


async def layout(page: Page) -> dict[str, Any]:
    found: dict[str, Any] = await page.evaluate(OVERFLOW_JS)
    found["wraps"] = await page.evaluate(WRAPS_JS)
    return found


async def alert_rows(page: Page) -> list[tuple[str, str]]:
    """(rule, severity) of every alert row shown, group members included."""
    shown = await page.evaluate(
        "[...document.querySelectorAll('#alerts tbody tr[data-fingerprint]:not(.message)')]"
        ".map(tr => [tr.dataset.rule, tr.dataset.severity])"
    )
    return [(rule, severity) for rule, severity in shown]


async def set_filter(page: Page, text: str) -> None:
    await page.evaluate(
        "(i => { i.value = " + json.dumps(text) + "; i.dispatchEvent(new Event('input', "
        "{bubbles: true})); })(document.querySelector('#alerts-filter'))"
    )


@needs_chromium
async def test_views_fit_wrap_and_alerts_filter_and_group(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    ib_root = lab_node(tmp_path, "h100-ib-12nic", IB_NODE)
    roce_root = lab_node(tmp_path, "roce-cx6dx", ROCE_NODE)
    async with AsyncExitStack() as stack:
        # No startup hold: the lab fleet's fleet-wide skew alerts fire at once (docs/alerts.md).
        quick = AlertWiring(engine=EngineSettings(startup_grace_s=0.0))
        agg = await stack.enter_async_context(aggregator(settings(own_nats.url, alerts=quick)))
        ib_agent = await stack.enter_async_context(agent(own_nats.url, ib_root, IB_NODE))
        await stack.enter_async_context(agent(own_nats.url, roce_root, ROCE_NODE))
        await wait_until(lambda: {IB_NODE, ROCE_NODE} <= set(agg.fleet.names()), what="nodes")
        # rdma/ib on the one adapter whose port goes down: the trace breaks at rdma-device.
        port_down(ib_root, "mlx5_3", 1)
        status = plugin_status(IB_NODE, ("mlx5_3",), epoch=ib_agent.epoch)
        await publish(own_nats.url, IB_NODE, subjects.STATUS, encode(status))
        await wait_until(
            lambda: (r := agg.fleet.get(IB_NODE)) is not None and r.device_plugin is not None,
            what="device-plugin status",
        )
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=agg.api_url or ""))
        page = await stack.enter_async_context(
            open_page(tmp_path / "browser", width=WIDTHS["laptop"][0], height=WIDTHS["laptop"][1])
        )

        # `/` leads to the page.
        await page.goto(f"{agg.api_url}/")
        assert await page.evaluate("window.location.pathname") == "/ui/"
        await page.wait_for(
            "document.querySelectorAll('#fleet tbody tr[data-state=ready]').length === 2",
            what="two ready nodes",
        )
        await page.wait_for("document.querySelector('#live').dataset.state === 'live'")
        # The fleet's links to a trace keep the resource's '/' as typed.
        hrefs = await rows(page, "#resources tbody a", "href")
        assert hrefs == [f"#/trace/{IB_NODE}/{RESOURCE}"]

        # Alerts: skew as one group per rule, severity and state, counted like the API's
        # alerts, whether a skew rule raises one alert per adapter or one per version set.
        await page.wait_for(
            "!!document.querySelector("
            "'#alerts tr[data-rule=port-down][data-subject=\"mlx5_3/1\"]')",
            what="the mlx5_3/1 port-down alert",
        )
        alerts: list[dict[str, Any]] = []
        shown_groups: dict[str, int] = {}

        async def groups_match_the_api() -> bool:
            alerts[:] = [
                a
                for a in (await http.get("/api/v1/alerts")).json()["items"]
                if a["state"] == "firing"
            ]
            per_rule = Counter(a["rule"] for a in alerts if a["rule"].endswith("-skew"))
            shown_groups.clear()
            shown_groups.update(
                await page.evaluate(
                    "Object.fromEntries([...document.querySelectorAll("
                    "'#alerts tbody.group:has(tr.group-head[data-state=firing])')]"
                    ".map(g => [g.dataset.rule, Number(g.dataset.count)]))"
                )
            )
            return bool(per_rule) and shown_groups == {
                rule: n for rule, n in per_rule.items() if n > 1
            }

        await wait_until(groups_match_the_api, what="the page's skew groups as the API's alerts")
        if shown_groups:  # the lab pair disagrees: open the largest group
            rule = max(shown_groups, key=lambda r: shown_groups[r])
            members_of = [a for a in alerts if a["rule"] == rule]
            head = f"#alerts tbody.group[data-rule={rule}]"
            count = f"document.querySelectorAll('{head} tr.member').length"
            assert await page.evaluate(count) == 0
            await page.evaluate(f"document.querySelector('{head} button.toggle').click()")
            members = await page.wait_for(
                f"[...document.querySelectorAll('{head} tr.member[data-subject]:not(.message)')]"
                ".map(tr => tr.dataset.node + '/' + tr.dataset.subject)"
            )
            assert sorted(members) == sorted(f"{a['node']}/{a['subject']}" for a in members_of)
        await page.screenshot(artifact("ui-alerts-lab.png"), "#alerts-panel")
        for opened in await page.evaluate(
            "[...document.querySelectorAll('#alerts button.toggle[aria-expanded=true]')]"
            ".map(b => b.closest('tbody').dataset.group)"
        ):
            await page.evaluate(
                f"document.querySelector('#alerts tbody[data-group={json.dumps(opened)}] "
                "button.toggle').click()"
            )

        # Words filter: every word must appear in message, node, rule or subject.
        await set_filter(page, "port-down mlx5_3")
        await page.wait_for(
            "document.querySelectorAll('#alerts tbody tr[data-fingerprint]:not(.message)')"
            ".length === 1",
            what="one alert left by the filter",
        )
        assert await alert_rows(page) == [("port-down", "critical")]
        assert not await page.evaluate("document.querySelector('#alerts-shown').hidden")
        await set_filter(page, "no-such-words-anywhere")
        empty = await page.wait_for(
            "!document.querySelector('#alerts-empty').hidden"
            " && document.querySelector('#alerts-empty').textContent"
        )
        assert "matches the filter" in empty
        await set_filter(page, "")
        # Severity: warnings off leaves the criticals (and no skew group).
        await page.evaluate(
            "document.querySelector('#alerts-severity input[value=warning]').click()"
        )
        warning_rows = "document.querySelectorAll('#alerts tbody tr[data-severity=warning]').length"
        await page.wait_for(f"{warning_rows} === 0", what="no warning rows")
        shown = await alert_rows(page)
        assert shown and {severity for _, severity in shown} == {"critical"}
        firing_rows = await rows(
            page, "#alerts tbody tr[data-state=firing]:not(.message)", "data-rule"
        )
        assert len(firing_rows) == sum(a["severity"] == "critical" for a in alerts)
        await page.evaluate(
            "document.querySelector('#alerts-severity input[value=warning]').click()"
        )
        await page.wait_for(f"{warning_rows} > 0", what="warning rows back")
        # Resolved alerts off: only firing rows are left.
        await page.evaluate("document.querySelector('#alerts-resolved').click()")
        states = await rows(page, "#alerts tbody tr[data-state]", "data-state")
        assert states and set(states) == {"firing"}
        await page.evaluate("document.querySelector('#alerts-resolved').click()")

        # Every view at both widths: nothing overflows, names wrap at sensible points, and
        # the trace's arrows join neighbours on one row only.
        trace_hash = f"#/trace/{IB_NODE}/{RESOURCE}"  # typed: the resource's '/' unencoded
        views = {
            "fleet": ("#/", "document.querySelector('#view').dataset.view === 'fleet'"),
            "node": (
                f"#/node/{IB_NODE}",
                "document.querySelectorAll('#topology td[data-nic]').length === 96"
                " && document.querySelectorAll('#findings tbody tr').length > 0",
            ),
            "trace": (trace_hash, "document.querySelectorAll('#chain li[data-link]').length > 0"),
        }
        scrolled: dict[tuple[str, str], list[str]] = {}
        for width_name, (width, height) in WIDTHS.items():
            await page.set_viewport(width, height)
            for view_name, (hash_, ready) in views.items():
                await show(page, hash_, ready)
                await page.evaluate(
                    "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
                )
                found = await layout(page)
                where = f"{view_name} at {width}px"
                assert found["overflowing"] == [], (where, found)
                assert found["wraps"] == [], (where, found)
                scrolled[(view_name, width_name)] = found["scrolling"]
                await page.screenshot(artifact(f"ui-{view_name}-{width_name}.png"))
                if view_name == "trace":
                    arrows = await page.evaluate(ARROWS_JS)
                    assert dangling(arrows) == [], where
                    rows_of_chain = sum(not same_row for *_, same_row in arrows)
                    assert rows_of_chain > 1, f"{where}: the chain should wrap"
        # At laptop width the tables fit their cards outright; only the GPU x NIC matrix
        # and the wide ports table may scroll sideways in a narrow window.
        assert all(not boxes for (_, w), boxes in scrolled.items() if w == "laptop"), scrolled
        assert all(set(boxes) <= {"topology", "ports"} for (_, w), boxes in scrolled.items()), (
            scrolled
        )

        # The typed trace address shows the resource and the same chain as the API.
        trace = (
            await http.get("/api/v1/trace", params={"node": IB_NODE, "resource": RESOURCE})
        ).json()
        await page.set_viewport(*WIDTHS["laptop"])
        await show(page, trace_hash, views["trace"][1])
        assert await rows(page, "#chain li[data-link]", "data-link") == [
            link["name"] for link in trace["links"]
        ]
        assert RESOURCE in await page.evaluate("document.querySelector('#view h1').textContent")
        assert RESOURCE in await page.evaluate("document.querySelector('#crumbs').textContent")

        # The screenshots docs/ui.md shows.
        await show(page, "#/", views["fleet"][1])
        await screenshot(page, "ui-fleet.png")
        await show(page, f"#/node/{IB_NODE}", views["node"][1])
        await screenshot(page, "ui-topology.png", "#topology")
        await show(page, trace_hash, views["trace"][1])
        await screenshot(page, "ui-trace.png")
        await no_page_errors(page)


def fake_alert(rule: str, node: str, subject: str, **extra: object) -> dict[str, object]:
    """An alert as GET /api/v1/alerts lists it (proto/messages/alerts.py)."""
    alert: dict[str, object] = {
        "schema": "nicfleet.v1.Alert",
        "rule": rule,
        "severity": "warning",
        "state": "firing",
        "node": node,
        "subject": subject,
        "message": f"{subject} on {node}: {rule}.",
        "evidence": {},
        "starts_at": time.time() - 60,
        "ends_at": None,
        "fingerprint": f"{rule}/{node}/{subject}",
    }
    alert.update(extra)
    return alert


# Skew in both shapes: fw-skew one alert per adapter (three on two nodes), driver-skew one
# fleet-wide alert per version set (two, each its own message), clock-skew once; plus a
# resolved fw-skew (a group of its own state) and port-down, which is never grouped.
SEEN = {"versions_seen": "28.39.2048,28.41.1000"}


def fw(node: str, adapter: str) -> dict[str, object]:
    message = (
        f"{adapter} (ConnectX-7) runs firmware 28.39.2048, unlike the fleet's 28.41.1000;"
        " flash the fleet's version (mlxfwmanager)."
    )
    return fake_alert("fw-skew", node, adapter, evidence=SEEN, message=message)


def driver(module: str, versions: str) -> dict[str, object]:
    message = (
        f"Module {module} differs across the fleet ({versions}): no version has a majority;"
        " pin one in a NicFleetPolicy."
    )
    return fake_alert("driver-skew", "_fleet", module, message=message)


FAKE_ALERTS = [
    fw("gpu-node-a", "mlx5_0"),
    fw("gpu-node-a", "mlx5_1"),
    fw("gpu-node-b", "mlx5_0"),
    driver("mlx5_core", "24.04-0.7.0 on 2 nodes, 24.07-0.6.1 on 2"),
    driver("ib_core", "24.04-0.7.0 on 2 nodes, srcversion 470ABACCE6EED74DDEA7881 on 2"),
    fake_alert(
        "clock-skew",
        "gpu-node-b",
        "clock",
        message="The agent's clock is 7.2 s ahead of the aggregator's.",
    ),
    fake_alert("fw-skew", "gpu-node-c", "mlx5_2", state="resolved", ends_at=time.time()),
    fake_alert(
        "port-down",
        "gpu-node-a",
        "mlx5_0/1",
        severity="critical",
        message="mlx5_0/1 is DOWN (physical state Disabled): check the cable and the switch port.",
    ),
    fake_alert(
        "port-down",
        "gpu-node-a",
        "mlx5_1/1",
        severity="critical",
        message="mlx5_1/1 is DOWN (physical state Polling): check the cable and the switch port.",
    ),
]
for age, listed in enumerate(FAKE_ALERTS):  # newest first, in the order above
    listed["starts_at"] = time.time() - 60 - age


@asynccontextmanager
async def fake_api(alerts: list[dict[str, object]]) -> AsyncIterator[str]:
    """The page's files and just enough JSON API for the fleet view and the alerts panel
    (no alert stream: the page says `reconnecting` and keeps the listed alerts)."""
    app = web.Application()
    add_ui_routes(app)

    def answer(body: object) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(body)

        return handler

    app.router.add_get("/api/v1/nodes", answer({"items": [], "total": 0}))
    app.router.add_get("/api/v1/resources", answer({"items": []}))
    app.router.add_get("/api/v1/alerts", answer({"items": alerts}))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@needs_chromium
async def test_skew_alerts_group_per_rule_in_either_shape(tmp_path: Path) -> None:
    laptop = WIDTHS["laptop"]
    async with (
        fake_api(FAKE_ALERTS) as base,
        open_page(tmp_path / "browser", width=laptop[0], height=laptop[1]) as page,
    ):
        await page.goto(f"{base}/ui/")
        await page.wait_for(
            "document.querySelectorAll('#alerts tbody').length > 0", what="the alerts panel"
        )
        bodies = await page.evaluate(
            "[...document.querySelectorAll('#alerts tbody')].map(b => [b.className,"
            " b.dataset.rule ?? b.querySelector('tr').dataset.rule, Number(b.dataset.count || 1),"
            " b.querySelector('tr.message').textContent])"
        )
        # Firing first (critical, then warning), a group where its first member was.
        assert [(cls, rule, n) for cls, rule, n, _ in bodies] == [
            ("alert", "port-down", 1),
            ("alert", "port-down", 1),
            ("group", "fw-skew", 3),
            ("group", "driver-skew", 2),
            ("alert", "clock-skew", 1),
            ("alert", "fw-skew", 1),  # the resolved one: another state, not in the group
        ]
        summaries = {rule: text for cls, rule, _, text in bodies if cls == "group"}
        assert summaries["fw-skew"].startswith(
            "3 fw-skew alerts on 2 nodes (gpu-node-a ×2, gpu-node-b ×1);"
            " versions seen: 28.39.2048,28.41.1000."
        )
        assert summaries["driver-skew"].startswith("2 driver-skew alerts fleet-wide.")
        assert await page.evaluate("document.querySelector('#alerts-count').textContent") == "8"
        counts = await page.evaluate(
            "[...document.querySelectorAll('#alerts-severity [data-count]')]"
            ".map(c => c.textContent)"
        )
        assert counts == ["2", "6", "0"]
        # Opening a group shows its members; the choice survives the next redraw.
        group = "#alerts tbody.group[data-rule=driver-skew]"
        await page.evaluate(f"document.querySelector('{group} button.toggle').click()")
        members = f"[...document.querySelectorAll('{group} tr.member[data-subject]')]"
        subjects = await page.wait_for(f"{members}.map(tr => tr.dataset.subject)")
        assert subjects == ["mlx5_core", "ib_core"]
        await set_filter(page, "")
        assert await page.evaluate(f"{members}.length") == 2
        assert (await layout(page))["wraps"] == []
        await screenshot(page, "ui-alerts.png", "#alerts-panel")
        # The words filter works inside groups: a group of one is a plain row.
        await set_filter(page, "fw-skew node-b")
        await page.wait_for(
            "document.querySelectorAll('#alerts tbody').length === 1", what="one row left"
        )
        assert await rows(page, "#alerts tbody tr[data-subject]", "data-subject") == ["mlx5_0"]
        await no_page_errors(page)
