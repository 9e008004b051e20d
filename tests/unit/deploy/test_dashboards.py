"""deploy/grafana/nicfleet-dashboard.json: every query reads only metric names a live agent
and aggregator export, parses as PromQL (promtool, Grafana variables filled in), and the
per-node panels follow the `node` variable; deploy/prometheus/podmonitors.yaml parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.bus.natsserver import NatsServer
from tests.support.livemetrics import exported_names, live_scrape
from tests.support.paths import REPO
from tests.support.promqlnames import metric_names

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "nicfleet-dashboard.json"
SCRAPE_SERIES = frozenset({"up"})  # made by Prometheus for every target
_LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", ())


def expressions(doc: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(doc) for t in p.get("targets", ())]


def variable_metrics(doc: dict[str, Any]) -> set[str]:
    found = set()
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            match = _LABEL_VALUES.fullmatch(var["query"]["query"])
            assert match is not None, var
            found.add(match.group(1))
    return found


def test_layout_ids_and_datasources() -> None:
    doc = dashboard()
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in panels(doc) if p["type"] == "row"}
    assert {"Fleet overview", "Topology findings and alerts"} <= titles
    assert any(t.startswith("Device plugin") for t in titles)
    for p in panels(doc):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "node"]


def test_agent_queries_follow_the_node_variable() -> None:
    for expr in expressions(dashboard()):
        agent_series = [n for n in metric_names(expr) if n.startswith("nicfleet_agent_")]
        if agent_series:
            assert 'node=~"$node"' in expr, expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")
def test_every_query_is_promql(tmp_path: Path) -> None:
    filled = [
        e.replace("$__rate_interval", "5m").replace("$node", ".*") for e in expressions(dashboard())
    ]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(filled)]}]}  # fmt: skip
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_podmonitors_parse_and_name_the_jobs_the_rules_use() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "prometheus" / "podmonitors.yaml").read_text()))
    jobs = {
        r["replacement"]
        for d in docs
        for e in d["spec"]["podMetricsEndpoints"]
        for r in e["relabelings"]
        if r["targetLabel"] == "job"
    }
    assert jobs == {"nicfleet-agent", "nicfleet-aggregator"}
    assert all(d["kind"] == "PodMonitor" for d in docs)


async def test_dashboard_reads_only_exported_metrics(nats_server: NatsServer) -> None:
    scrapes = await live_scrape(nats_server.url)
    exported = exported_names(scrapes.agent) | exported_names(scrapes.aggregator) | SCRAPE_SERIES
    doc = dashboard()
    used = {name for e in expressions(doc) for name in metric_names(e)} | variable_metrics(doc)
    assert len(used) > 20
    assert used <= exported, sorted(used - exported)
