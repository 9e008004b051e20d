"""One definition of "this resource is unusable on this node": the resource-zero rule and
the resources view (`nicfleetctl resources` ZERO / UNHEALTHY) name the same nodes."""

from __future__ import annotations

import pytest

from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.servable import unusable
from aggregator.fleet.state import Fleet
from aggregator.rules.descriptor import RuleInput
from aggregator.rules.engine.registry import run_rule
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from aggregator.trace.resources import summarize_resources
from proto.messages.status import ResourceStatus
from tests.support.builders import T0, plugin_status, rdma_policy, resource_status, snapshot

IB = "rdma/ib"
STATUSES = {
    "ok": resource_status(IB, devices=("mlx5_0",)),
    "zero": resource_status(IB, devices=(), advertised=0),
    "unhealthy": resource_status(IB, devices=("mlx5_0",), healthy=0),
    "invalid": ResourceStatus(name=IB, registration="config-invalid",
                              config_path="configList[0].resourceName", config_error="bad"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "why"),
    [
        pytest.param(None, None, id="no-status-not-judged"),
        pytest.param(plugin_status("n"), "not-served", id="not-served"),
        pytest.param(plugin_status("n", STATUSES["ok"]), None, id="ok"),
        pytest.param(plugin_status("n", STATUSES["zero"]), "advertises-0", id="zero"),
        pytest.param(plugin_status("n", STATUSES["unhealthy"]), "no-healthy", id="unhealthy"),
        pytest.param(plugin_status("n", STATUSES["invalid"]), None, id="config-invalid"),
    ],
)  # fmt: skip
def test_unusable(status: object, why: str | None) -> None:
    assert unusable(status, IB) == why  # type: ignore[arg-type]


def test_resource_zero_and_the_resources_view_name_the_same_nodes() -> None:
    fleet = Fleet()
    for name, status in {**STATUSES, "unreported": None, "not-served": "-"}.items():
        fleet.apply_snapshot(snapshot(name), T0 if name != "stale" else T0 - 999)
        if isinstance(status, ResourceStatus):
            fleet.apply_status(plugin_status(name, status), T0)
        elif status == "-":
            fleet.apply_status(plugin_status(name), T0)
    fleet.apply_snapshot(snapshot("stale"), T0 - 999)
    fleet.apply_status(plugin_status("stale", STATUSES["zero"]), T0 - 999)
    policies = (rdma_policy("ib", IB),)
    view = fleet.view()
    given = RuleInput(view, policies, NO_CLUSTER, T0 + 1, DEFAULT_THRESHOLDS)
    fired = {(f.node, f.message.split(" on ")[0]) for f in run_rule("resource-zero", given)}
    (summary,) = summarize_resources(
        fleet=view, cluster=NO_CLUSTER, policies=policies, now=T0 + 1, stale_after=30.0
    )
    assert {n for n, _ in fired} == {*summary.zero_nodes, *summary.unhealthy_nodes}
    assert set(summary.unhealthy_nodes) == {
        n for n, what in fired if what.endswith("has no healthy device")
    }
    assert set(summary.zero_nodes) == {"zero", "not-served", "stale"}
