"""deploy/prometheus: the rules file passes `promtool check rules` and its unit tests (every
alert fires / stays silent), reads only metrics the processes export, and the
PrometheusRule object is exactly the same groups
(`python -m tests.unit.deploy.test_prometheus_rules` regenerates it)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml

from aggregator.bus.natsserver import NatsServer
from tests.support.livemetrics import exported_names, live_scrape
from tests.support.paths import REPO
from tests.support.promqlnames import metric_names

DIR = REPO / "deploy" / "prometheus"
RULES = DIR / "nicfleet-rules.yaml"
OPERATOR = DIR / "prometheusrule.yaml"
# Series Prometheus makes itself for every target (not exported by nicfleet).
SCRAPE_SERIES = frozenset({"up"})
HEADER = (
    "# Generated from nicfleet-rules.yaml (regenerate: .venv/bin/python -m\n"
    "# tests.unit.deploy.test_prometheus_rules); a test fails when the two differ.\n"
)
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The rules file's groups as a Prometheus Operator PrometheusRule."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "nicfleet",
            "namespace": "nicfleet-system",
            "labels": {
                "app.kubernetes.io/name": "nicfleet",
                "app.kubernetes.io/part-of": "nicfleet",
            },
        },
        "spec": {"groups": rules["groups"]},
    }


def render() -> str:
    doc = prometheus_rule(yaml.safe_load(RULES.read_text()))
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


@needs_promtool
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    for command in (["check", "rules", RULES.name], ["test", "rules", "nicfleet-rules.test.yaml"]):
        result = subprocess.run(["promtool", *command], cwd=DIR, capture_output=True, check=False)
        assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_every_alert_has_a_unit_test_and_a_severity() -> None:
    tested = yaml.safe_load((DIR / "nicfleet-rules.test.yaml").read_text())
    names = {c["alertname"] for t in tested["tests"] for c in t["alert_rule_test"]}
    fired = {
        c["alertname"] for t in tested["tests"] for c in t["alert_rule_test"] if c["exp_alerts"]
    }
    assert {r["alert"] for r in alerts()} == names == fired
    assert {r["labels"]["severity"] for r in alerts()} <= {"critical", "warning", "info"}


def test_the_prometheusrule_is_generated_from_the_rules_file() -> None:
    assert OPERATOR.read_text() == render(), (
        "regenerate: python -m tests.unit.deploy.test_prometheus_rules"
    )
    doc = yaml.safe_load(OPERATOR.read_text())
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_tokenizer() -> None:
    expr = (
        'sum by (instance, reason) (rate(nicfleet_ingest_rejected_total{kind="a b"}[5m])) > 0'
        ' or on (x) max(up{job="j"})'
        " / ignoring(le) histogram_quantile(0.9, a_bucket[$__rate_interval])"
    )
    assert metric_names(expr) == {"nicfleet_ingest_rejected_total", "up", "a_bucket"}


async def test_rules_read_only_exported_metrics(nats_server: NatsServer) -> None:
    scrapes = await live_scrape(nats_server.url)
    exported = exported_names(scrapes.agent) | exported_names(scrapes.aggregator) | SCRAPE_SERIES
    used = {name for r in alerts() for name in metric_names(r["expr"])}
    assert used and used <= exported, used - exported


if __name__ == "__main__":
    OPERATOR.write_text(render())
    print(f"wrote {OPERATOR}")
